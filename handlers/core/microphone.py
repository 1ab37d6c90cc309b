"""A session's microphone audio: a bounded buffer addressed by stream sample, and the turn
detector that owns it when server turn detection is on.

Samples are counted from the first audio the session received (sample 0), so a stretch of
speech keeps its address while older audio is dropped in front of it. Without turn detection
the buffer waits for a question (or a commit) to take it, and audio past ``max_bytes`` is an
``audio_overflow``; with it, only the audio a question may still need is kept (the padding
before speech, the speech itself) and a long speech drops its oldest audio instead of
failing. Pure and synchronous, like the rest of the core; its own tests in
``tests/core/speech/test_speech.py`` and ``tests/core``.
"""

from __future__ import annotations

from dataclasses import dataclass

from handlers.core.turn_detection import RATE, SpeechStopped, TurnDetector, TurnEvent
from handlers.media.preparation import decode_base64
from handlers.wire.errors import ErrorCode, SessionError


@dataclass(frozen=True, slots=True)
class SpokenQuestion:
    """Audio that server turn detection found to be one question (16 kHz PCM16)."""

    start_ms: float
    end_ms: float
    pcm16: bytes
    item_id: str = ""  # the speech's item (``SessionCore.speech_item`` when it started)


def decode_pcm(data: str) -> bytes:
    """Base64 PCM16 as bytes. Raises ``invalid_audio``."""
    pcm = decode_base64(data, ErrorCode.INVALID_AUDIO, "audio")
    if len(pcm) % 2:
        raise SessionError(ErrorCode.INVALID_AUDIO, "PCM16 audio must have an even number of bytes")
    return pcm


def audio_ms(pcm16: bytes) -> float:
    """How long 16 kHz PCM16 audio is, in ms."""
    return round(len(pcm16) / 2 * 1000 / RATE, 1)


class Microphone:
    """The buffered audio (``buffer`` holds stream samples ``origin`` .. ``total``) and, when
    turn detection is on, its ``detector``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.buffer = bytearray()
        self.origin = 0  # stream sample of buffer[0]
        self.total = 0  # samples received
        self.detector: TurnDetector | None = None

    def detect_turns(self, detector: TurnDetector | None) -> None:
        """Switch turn detection on (``detector``) or off; the audio starts afresh."""
        self.detector = detector
        self.buffer.clear()
        self.origin = self.total = 0

    def add(self, pcm: bytes) -> None:
        """Buffer ``pcm``. Raises ``audio_overflow`` without turn detection (the buffer is then
        cleared); with it, the oldest audio is dropped instead."""
        self.total += len(pcm) // 2
        if self.detector is None and len(self.buffer) + len(pcm) > self.max_bytes:
            self.clear()
            raise SessionError(
                ErrorCode.AUDIO_OVERFLOW, f"buffered audio would exceed {self.max_bytes} bytes; the buffer was cleared",
            )
        self.buffer.extend(pcm)
        excess = len(self.buffer) - self.max_bytes
        if excess > 0:
            self.drop_before(self.origin + (excess + 1) // 2)

    def take(self) -> bytes:
        """Everything buffered, which leaves the buffer (a question or a commit takes it)."""
        pcm = bytes(self.buffer)
        self.clear()
        return pcm

    def clear(self) -> None:
        self.buffer.clear()
        self.origin = self.total

    def heard(self, probabilities: list[float], padding: int) -> list[TurnEvent | SpokenQuestion]:
        """Judge the next voice-activity windows (turn detection must be on): each start, and
        for each stop the ``SpeechStopped`` then the question's audio, from ``padding``
        samples before the start to where the silence was complete (its ``item_id`` is left
        for the caller). While nobody speaks, only the padding's worth of audio is kept."""
        assert self.detector is not None
        out: list[TurnEvent | SpokenQuestion] = []
        for event in self.detector.feed(probabilities):
            out.append(event)
            if isinstance(event, SpeechStopped):
                pcm = self.between(event.start_sample - padding, event.detected_sample)
                self.drop_before(event.detected_sample)
                out.append(SpokenQuestion(event.start_ms, event.end_ms, pcm))
        if not self.detector.speaking:
            self.drop_before(self.detector.position - padding)
        return out

    def question_start(self, padding: int) -> int | None:
        """Where the audio of a question being spoken now begins (a stream sample), or None:
        with turn detection, ``padding`` before the speech that has started; without it,
        the whole buffer (the next question takes it)."""
        if self.detector is None:
            return self.origin if self.buffer else None
        if self.detector.speech_start is None:
            return None
        return max(0, self.detector.speech_start - padding)  # fixed for the whole speech

    def since(self, sample: int) -> bytes:
        """The buffered audio from stream sample ``sample`` to the newest."""
        return self.between(sample, self.total)

    def between(self, start: int, end: int) -> bytes:
        lo = max(0, start - self.origin) * 2
        hi = max(0, end - self.origin) * 2
        return bytes(self.buffer[lo:hi])

    def drop_before(self, sample: int) -> None:
        drop = sample - self.origin
        if drop > 0:
            del self.buffer[: drop * 2]
            self.origin += min(drop, self.total - self.origin)

