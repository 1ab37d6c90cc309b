"""The voice stages' interface: what a session asks of speech synthesis, transcription and
voice activity detection when the engine cannot speak or listen by itself.

- ``Synthesizer``: text -> 24 kHz mono PCM16 (one sentence at a time).
- ``Transcriber``: 16 kHz mono PCM16 -> text, at once or through a ``TranscriptStream`` fed
  while the user speaks (so the words are ready about when the speech stops).
- ``VoiceActivityModel``: 16 kHz PCM16 -> one speech probability per fixed window, through a
  per-session ``VadStream`` that carries the model's recurrent state.

``Voice`` bundles whichever stages the server runs. Stage failures surface as
``SpeechError`` (safe to log, not to send).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class SpeechError(Exception):
    """A voice stage could not serve a request. The message is safe to log, not to send."""


class Synthesizer(ABC):
    """Turns text into speech."""

    #: The path's name, shown to clients as ``capabilities.voice_output``.
    name: str
    #: The voice used when a session names none.
    default_voice: str

    async def start(self) -> None:
        """Load what synthesis needs. Raises ``SpeechError``."""

    async def close(self) -> None:
        """Release it."""

    def knows_voice(self, voice: str) -> bool:
        """True when ``voice`` can be used (remote servers take any name)."""
        return True

    @abstractmethod
    async def synthesize(self, text: str, voice: str, rate: float) -> bytes:
        """Speak ``text``; returns mono PCM16 at 24 kHz (no header).

        ``rate`` scales the speaking rate (1.0 = normal). Raises ``SpeechError``.
        """


class TranscriptStream(ABC):
    """One utterance transcribed as its audio arrives. One call at a time; ``aclose`` always."""

    @abstractmethod
    async def feed(self, pcm16: bytes) -> None:
        """Recognise more audio (16 kHz mono PCM16). Cancellable within one small step.
        Raises ``SpeechError``."""

    @abstractmethod
    async def finish(self) -> str:
        """End the utterance; returns its words (empty when none). Raises ``SpeechError``."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the stream holds (idempotent; safe after a cancelled ``feed``)."""


class BufferedTranscript(TranscriptStream):
    """A stream for a transcriber that only takes whole utterances: audio is kept until
    ``finish`` sends it all at once."""

    def __init__(self, transcriber: Transcriber) -> None:
        self._transcriber = transcriber
        self._audio = bytearray()

    async def feed(self, pcm16: bytes) -> None:
        self._audio.extend(pcm16)

    async def finish(self) -> str:
        audio, self._audio = bytes(self._audio), bytearray()
        return await self._transcriber.transcribe(audio)

    async def aclose(self) -> None:
        self._audio = bytearray()


class Transcriber(ABC):
    """Turns a spoken question into text."""

    #: The path's name, shown to clients as ``capabilities.voice_input``.
    name: str

    async def start(self) -> None:
        """Load the recogniser. Raises ``SpeechError``."""

    async def close(self) -> None:
        """Release it."""

    @abstractmethod
    async def transcribe(self, pcm16: bytes) -> str:
        """Returns the words in ``pcm16`` (mono, 16 kHz); empty when none. Raises ``SpeechError``."""

    def open_stream(self) -> TranscriptStream:
        """A stream for one utterance (default: buffered, transcribed whole at ``finish``)."""
        return BufferedTranscript(self)


class VadStream(ABC):
    """One microphone stream's detector state. Not thread-safe: one call at a time."""

    @abstractmethod
    def process(self, pcm16: bytes) -> list[float]:
        """Blocking: feed 16 kHz PCM16; returns a speech probability for every window completed
        by it (samples left over wait for the next call)."""


class VoiceActivityModel(ABC):
    """A voice activity detector shared by all sessions."""

    name: str
    #: Samples per window at 16 kHz; window i covers samples [i*n, (i+1)*n) of a stream.
    window_samples: int

    async def start(self) -> None:
        """Load the model. Raises ``SpeechError``."""

    async def close(self) -> None:
        """Release it."""

    @abstractmethod
    def open_stream(self) -> VadStream:
        """A fresh detector state for one session's microphone."""

    @abstractmethod
    async def probabilities(self, stream: VadStream, pcm16: bytes) -> list[float]:
        """``stream.process(pcm16)`` off the event loop (bounded)."""


@dataclass
class Voice:
    """The voice stages this server runs (any may be None: that path is off) and the bounds
    every session's speech stage keeps (settings ``speech_*``, ``native_audio_trim_ms``)."""

    synthesizer: Synthesizer | None = None
    transcriber: Transcriber | None = None
    vad: VoiceActivityModel | None = None
    max_sentence_chars: int = 160
    max_pending_sentences: int = 16
    sentence_pause_ms: float = 120.0
    native_trim_ms: float = 20.0

    async def start(self) -> None:
        """Start every stage. Raises ``SpeechError``."""
        for stage in (self.synthesizer, self.transcriber, self.vad):
            if stage is not None:
                await stage.start()

    async def close(self) -> None:
        for stage in (self.synthesizer, self.transcriber, self.vad):
            if stage is not None:
                await stage.close()
