"""Speaking an answer while it is generated, and passing an engine's own audio on.

``SentenceSplitter`` (pure) cuts the text stream into sentences as soon as each is complete.
``SpokenAnswer`` speaks them in order: the adapter feeds it text deltas, a task in the
session's task group synthesizes each sentence off the event loop and sends it as one WAV
delta, while generation goes on. Sentences wait in a bounded queue; cancelling the answer
cancels the speaker and waits for it, so no audio of an answer follows its ``response.done``.
``Listening`` transcribes a question while it is spoken: the adapter hands
it audio as it arrives, a task in the session's task group feeds the transcriber, and the
words are ready about when the speech stops.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskStatus

from handlers.wire.errors import ErrorCode, SessionError
from handlers.session.transport import Disconnected
from handlers.core.negotiation import VoicePaths
from server.engines.base import Capabilities
from server.speech.base import SpeechError, Synthesizer, TranscriptStream, Voice
from server.speech.wav import OUTPUT_RATE, encode_wav, silence

log = logging.getLogger("livesight.speech")

# A sentence ends at . ! ? or an ellipsis, optionally followed by closing quotes or brackets,
# then whitespace; CJK full stops end one by themselves; so does a line break.
_END = re.compile(r"""(?:[.!?\u2026]+["'\u201d\u2019)\]]*\s+|[\u3002\uff01\uff1f]+|\n+)""")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st sr jr vs etc e.g i.e cf no fig approx dept est inc ltd co".split()
)
_SOFT_CUT = re.compile(r"[,;:\u3001\uff0c]\s")
# Markup symbols, control characters and U+FFFD (a byte the model produced that is no text).
_UNSPOKEN = re.compile(r"[*_#`~|<>\[\]{}^\x00-\x1f\x7f-\x9f\ufffd]+")
_SPEAKABLE = re.compile(r"\w")


class SentenceSplitter:
    """Cuts streamed text into speakable sentences.

    ``feed`` returns the sentences a delta completed; ``flush`` the rest at the end. Pending
    text never grows past ``max_chars``: a longer sentence is cut at a clause or word
    boundary (or, lacking one, at ``max_chars``).
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        """Add generated text; returns the sentences it completed, in order."""
        self._pending += text
        out: list[str] = []
        start = 0
        for match in _END.finditer(self._pending):
            candidate = self._pending[start : match.end()]
            if match.group().startswith(".") and _is_abbreviation(candidate):
                continue
            out.append(candidate)
            start = match.end()
        self._pending = self._pending[start:]
        while len(self._pending) > self.max_chars:
            cut = _cut_point(self._pending, self.max_chars)
            out.append(self._pending[:cut])
            self._pending = self._pending[cut:]
        return [s for s in (speakable(p) for p in out) if s]

    def flush(self) -> list[str]:
        """The text left when generation ends (at most one sentence)."""
        rest, self._pending = speakable(self._pending), ""
        return [rest] if rest else []


def speakable(text: str) -> str:
    """``text`` without markup symbols and extra whitespace; empty when nothing is left to say."""
    text = " ".join(_UNSPOKEN.sub(" ", text).split())
    return text if _SPEAKABLE.search(text) else ""


def _is_abbreviation(candidate: str) -> bool:
    words = candidate.rstrip().rstrip(".").split()
    if not words:
        return False
    last = words[-1].lower().lstrip("(\"'")
    if len(words) == 1 and last.isdigit():
        return True  # a list number ("1. Open the door.")
    return last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha() and last != "i")


def _cut_point(text: str, limit: int) -> int:
    head = text[:limit]
    clauses = list(_SOFT_CUT.finditer(head))
    if clauses and clauses[-1].end() > limit // 2:
        return clauses[-1].end()
    space = head.rfind(" ")
    return space + 1 if space > limit // 2 else limit


class SpokenAnswer:
    """The speech of one answer: text in, WAV deltas out, sentence by sentence.

    Each delta is delivered with the sentence it says. Start ``run`` in the session's task
    group with ``tg.start``; feed text with ``add_text``;
    end with ``finish`` (speaks the rest, waits) or ``cancel`` (stops at once, waits).
    Synthesis failures are reported once as ``speech_failed``; the text goes on without voice.
    """

    def __init__(
        self,
        synthesizer: Synthesizer,
        voice: str,
        rate: float,
        *,
        max_sentence_chars: int,
        max_pending_sentences: int,
        pause_ms: float,
        deliver: Callable[[bytes, str], Awaitable[None]],
        report: Callable[[SessionError], Awaitable[None]],
    ) -> None:
        self.synthesizer = synthesizer
        self.voice = voice
        self.rate = rate
        self.pause = silence(pause_ms, OUTPUT_RATE)
        self._deliver = deliver
        self._report = report
        self._splitter = SentenceSplitter(max_sentence_chars)
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, float]](max_pending_sentences)
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        #: (seconds from a sentence being complete to its audio being sent, audio seconds)
        self.latencies: list[tuple[float, float]] = []
        self.synthesis_s = 0.0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Speak queued sentences in order until ``finish`` or ``cancel``."""
        try:
            with self._scope:
                task_status.started()
                async with self._receive:
                    async for sentence, ready in self._receive:
                        started = time.perf_counter()
                        pcm = await self.synthesizer.synthesize(sentence, self.voice, self.rate)
                        self.synthesis_s += time.perf_counter() - started
                        if not pcm:
                            continue
                        await self._deliver(encode_wav(pcm + self.pause, OUTPUT_RATE), sentence)
                        self.latencies.append((time.perf_counter() - ready, len(pcm) / 2 / OUTPUT_RATE))
        except SpeechError as exc:
            log.warning("speech failed: %s", exc)
            await self._report(SessionError(ErrorCode.SPEECH_FAILED, "speech synthesis failed; the answer goes on as text"))
        except Disconnected:
            pass  # the client left; the session is ending
        finally:
            self._done.set()

    async def add_text(self, text: str) -> None:
        """Queue the sentences ``text`` completes (waits while the queue is full)."""
        for sentence in self._splitter.feed(text):
            await self._queue(sentence)

    async def finish(self) -> None:
        """Speak what is left, then wait until the last delta is sent."""
        for sentence in self._splitter.flush():
            await self._queue(sentence)
        self._send.close()
        await self._done.wait()

    async def cancel(self) -> None:
        """Stop speaking now and wait until the speaker has stopped."""
        self._scope.cancel()
        self._send.close()
        await self._done.wait()

    async def _queue(self, sentence: str) -> None:
        try:
            await self._send.send((sentence, time.perf_counter()))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the speaker stopped (speech failed, or it was cancelled): text only from here


class Listening:
    """One question's audio on its way into the transcriber, from stream sample ``start``.

    Start ``run`` in the session's task group with ``tg.start``; hand it audio with ``add``
    (never waits); end with ``finish`` (the words) or ``cancel`` (stops at once). The audio of
    one question is bounded by ``max_bytes``: past it the transcription fails (``finish``
    raises); neither it nor what waits to be recognised grows without bound.
    """

    def __init__(self, stream: TranscriptStream, start: int, max_bytes: int) -> None:
        self.start = start
        self.fed = start  # stream sample up to which audio was handed over
        self._stream = stream
        self._max_bytes = max_bytes
        self._total = 0
        self._pending = bytearray()
        self._wanted = anyio.Event()
        self._finishing = False
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._error: SpeechError | None = None
        self._transcript: str | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Feed the transcriber until ``finish`` or ``cancel``; always gives the stream back."""
        try:
            with self._scope:
                task_status.started()
                while True:
                    await self._wanted.wait()
                    self._wanted = anyio.Event()
                    while self._pending:
                        audio, self._pending = bytes(self._pending), bytearray()
                        await self._stream.feed(audio)
                    if self._error is not None:
                        return
                    if self._finishing:
                        self._transcript = await self._stream.finish()
                        return
        except SpeechError as exc:
            self._error = exc
        finally:
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
            self._done.set()

    def add(self, pcm16: bytes, samples_end: int, *, bounded: bool = True) -> None:
        """Hand over audio that runs up to stream sample ``samples_end``. ``bounded=False``:
        the question's own audio (``audio_data``, bounded by the message size) does not count."""
        if self._finishing or self._error is not None or not pcm16:
            self.fed = max(self.fed, samples_end)
            return
        self._total += len(pcm16) if bounded else 0
        if self._total > self._max_bytes:
            self._error = SpeechError(f"the question's audio is over {self._max_bytes} bytes")
        else:
            self._pending.extend(pcm16)
        self.fed = samples_end
        self._wanted.set()

    async def finish(self) -> str:
        """The words of everything handed over. Raises ``SpeechError``."""
        self._finishing = True
        self._wanted.set()
        await self._done.wait()
        if self._error is not None:
            raise self._error
        if self._transcript is None:
            raise SpeechError("the transcription was stopped")
        return self._transcript

    async def cancel(self) -> None:
        """Stop now and wait until the transcriber is released (idempotent)."""
        self._scope.cancel()
        await self._done.wait()


def voice_paths(capabilities: Capabilities, voice: Voice | None) -> VoicePaths:
    """What the engine does itself and what the voice stages add: native first, never both."""
    voice = voice or Voice()
    synth, asr = voice.synthesizer, voice.transcriber
    return VoicePaths(
        output="native" if capabilities.audio_output else (synth.name if synth else None),
        input="native" if capabilities.audio_input else (asr.name if asr else None),
        vad_window=voice.vad.window_samples if voice.vad else None,
        default_voice=None if capabilities.audio_output or synth is None else synth.default_voice,
        knows_voice=synth.knows_voice if synth and not capabilities.audio_output else (lambda v: True),
    )
