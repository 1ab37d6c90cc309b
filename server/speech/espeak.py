"""Embedded speech: eSpeak NG from the ``espeakng-loader`` wheel (library and voice data
inside), driven through ctypes. Nothing comes from the system.

eSpeak NG is one global engine per process: every call is serialised by a lock and runs
in one worker thread (a capacity limiter of one). A sentence takes a few milliseconds;
its 22,050 Hz output is resampled to 24 kHz with a polyphase filter.
"""

from __future__ import annotations

import ctypes
import os
import threading

import anyio

from server import blocking
from server.speech.base import SpeechError, Synthesizer
from server.speech.wav import OUTPUT_RATE, Pcm, resample

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_RATE = 1  # espeakRATE: words per minute
_DEFAULT_WPM = 175
_MIN_WPM, _MAX_WPM = 80, 450
_BUFFER_MS = 2000

_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


class _Library:
    """The loaded eSpeak NG library: one per process, used under ``lock``."""

    _instance: _Library | None = None
    _create_lock = threading.Lock()

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError as exc:
            raise SpeechError("the espeakng-loader package is not installed") from exc
        try:
            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            data_path = espeakng_loader.get_data_path()
        except (OSError, RuntimeError) as exc:
            raise SpeechError(f"eSpeak NG could not be loaded: {exc}") from exc
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_void_p, ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        # Long buffers: each callback takes the GIL, which a busy engine thread may hold for
        # up to the switch interval (5 ms); a few callbacks per sentence instead of one per 60 ms.
        self.rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, data_path.encode(), 0)
        if self.rate <= 0:
            raise SpeechError("eSpeak NG failed to initialise")
        self.lib = lib
        self.data_path = data_path
        self.lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._callback = _SynthCallback(self._collect)  # kept referenced for the library's lifetime
        lib.espeak_SetSynthCallback(self._callback)
        self._voice: str | None = None
        self._wpm: int | None = None

    @classmethod
    def get(cls) -> _Library:
        with cls._create_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _collect(self, wav: ctypes.POINTER(ctypes.c_short), count: int, events: int) -> int:
        if count > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, count * 2))
        return 0

    def voice_table(self) -> tuple[dict[str, str], dict[str, str]]:
        """Names a client may use -> the voice file to load; variant names (``+f3``) -> their file.

        A name is a voice file (``en-us``), a language (``en-gb``: its preferred voice) or a
        voice's full name (``english (america)``), all lower case.
        """
        files: dict[str, str] = {}
        languages: dict[str, tuple[int, str]] = {}
        with self.lock:
            table = self.lib.espeak_ListVoices(None)
            i = 0
            while table[i]:
                voice = table[i].contents
                i += 1
                if not voice.identifier:
                    continue
                ident = voice.identifier.decode("utf-8", "replace")
                files[ident.rsplit("/", 1)[-1].lower()] = ident
                if voice.name:
                    files.setdefault(voice.name.decode("utf-8", "replace").lower(), ident)
                at = voice.languages  # (priority byte, name, NUL) pairs, ending with a zero byte
                while at and (priority := ctypes.c_ubyte.from_address(at).value):
                    lang = ctypes.string_at(at + 1)
                    key = lang.decode("utf-8", "replace").lower()
                    if key not in languages or priority < languages[key][0]:
                        languages[key] = (priority, ident)
                    at += 2 + len(lang)
        for key, (_, ident) in languages.items():
            files.setdefault(key, ident)
        variants_dir = os.path.join(self.data_path, "voices", "!v")
        variants = {v.lower(): v for v in os.listdir(variants_dir)} if os.path.isdir(variants_dir) else {}
        return files, variants

    def speak(self, text: str, voice: str, wpm: int) -> bytes:
        """Blocking: the whole of ``text`` as PCM16 at ``self.rate``."""
        with self.lock:
            if voice != self._voice:
                if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise SpeechError(f"eSpeak NG has no voice {voice!r}")
                self._voice, self._wpm = voice, None
            if wpm != self._wpm:
                self.lib.espeak_SetParameter(_RATE, wpm, 0)
                self._wpm = wpm
            self._chunks = []
            encoded = text.encode("utf-8") + b"\0"
            if self.lib.espeak_Synth(encoded, len(encoded), 0, 0, 0, _CHARS_UTF8, None, None) != 0:
                raise SpeechError("eSpeak NG failed to synthesize")
            pcm, self._chunks = b"".join(self._chunks), []
            return pcm


class EspeakSynthesizer(Synthesizer):
    """eSpeak NG in process. Voices: a voice file or language (``en-us``, ``en-gb``, ``de``),
    optionally with a variant (``en-us+f3``)."""

    name = "espeak"

    def __init__(self, default_voice: str | None = None) -> None:
        self.default_voice = (default_voice or "en-us").lower()
        self._files: dict[str, str] = {}
        self._variants: dict[str, str] = {}
        self._library: _Library | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    async def start(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)
        await blocking.run_blocking(self.load, limiter=self._limiter)

    def load(self) -> None:
        """Blocking: load the library and its voice table, and pay first-call costs (voice
        data, the resampler's import). Raises ``SpeechError``."""
        self._library = _Library.get()
        self._files, self._variants = self._library.voice_table()
        if not self.knows_voice(self.default_voice):
            raise SpeechError(f"eSpeak NG has no voice {self.default_voice!r}")
        self.speak_sync("Ready.", self.default_voice, 1.0)

    def knows_voice(self, voice: str) -> bool:
        return self._voice_file(voice) is not None

    def _voice_file(self, voice: str) -> str | None:
        base, _, variant = voice.lower().partition("+")
        ident = self._files.get(base)
        if ident is None or (variant and variant not in self._variants):
            return None
        return f"{ident}+{self._variants[variant]}" if variant else ident

    async def synthesize(self, text: str, voice: str, rate: float) -> bytes:
        if self._library is None or self._limiter is None:
            raise SpeechError("the synthesizer is not started")
        return await blocking.run_blocking(self.speak_sync, text, voice, rate, limiter=self._limiter)

    def speak_sync(self, text: str, voice: str, rate: float) -> bytes:
        """Blocking: ``text`` as 24 kHz PCM16 (benchmarks time this directly). Raises ``SpeechError``."""
        library = self._library
        if library is None:
            raise SpeechError("the synthesizer is not started")
        ident = self._voice_file(voice)
        if ident is None:
            raise SpeechError(f"eSpeak NG has no voice {voice!r}")
        wpm = max(_MIN_WPM, min(_MAX_WPM, round(_DEFAULT_WPM * rate)))
        pcm = library.speak(text, ident, wpm)
        return resample(Pcm(pcm, library.rate), OUTPUT_RATE).samples
