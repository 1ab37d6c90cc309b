"""One answer, as data: what it asks, over which frames, what it said, and how it ended.

An ``Answer`` is made by the core when a question is asked (``SessionCore.plan_*``) and owns
everything of that answer until its end: the plan (its frames, pinned until it ends; the
question's text and audio; sampling, modalities, instructions; what started it), the prompt's
frames (``used``), the outputs (text, the audio sent and the words each piece said), the
client's edits while it runs (truncated, deleted) and its end (the outcome, what stopped it,
the error code). It turns each engine output into the core's events to send
(``events.py``) and makes exactly one end (``AnswerEnded``, after the text and audio "done"
events) per start.

Its phases: asked -> started -> ended, or asked -> withdrawn (nothing was sent). A move it does
not allow raises ``IllegalTransition`` (a bug in the code driving it, never a client's fault).
Times are passed in (seconds on one monotonic clock), so an answer runs in tests with no
socket, engine or clock: feed it engine outputs, read the events (``tests/scripted.py``'s
``run_answer``).
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from enum import Enum

from handlers.core.events import (
    AnswerAudioDelta,
    AnswerAudioDone,
    AnswerEnded,
    AnswerStarted,
    AnswerTextDelta,
    AnswerTextDone,
    ConsumedFrame,
    Event,
    FramesConsumed,
    QuestionTranscribed,
    Timings,
    Usage,
    WatchTrigger,
)
from handlers.core.frames import Frame
from handlers.core.prompt import frame_time_s
from handlers.core.turn_detection import RATE
from handlers.wire.commands import InputMessage
from handlers.wire.errors import Origin
from server.engines.base import AudioChunk, AudioSegment, EngineEvent, Finished, Sampling, TextDelta


class IllegalTransition(RuntimeError):
    """A move that the lifecycle does not allow: a bug in the code driving it."""


class Outcome(Enum):
    """How an answer ended: its ``response.done`` status."""

    COMPLETED = "completed"  # the engine finished it
    INTERRUPTED = "interrupted"  # cancelled (by the client, a new question, speech or the session's end)
    FAILED = "failed"  # the engine, speech or the server failed it (an error event says why)


class AnswerPhase(Enum):
    ASKED = "asked"
    STARTED = "started"
    ENDED = "ended"
    WITHDRAWN = "withdrawn"


#: What may stop an answer before it completes (``response.done.interrupted_by``).
CAUSES = frozenset({"cancel", "question", "speech", "session_end"})


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@dataclass(eq=False)
class Answer:
    """One answer from its question to its one ``response.done`` (see the module docstring).

    The plan's fields are set when it is asked; ``used`` and ``origin`` when its prompt is made
    (``SessionCore.query_prompt``); ``received`` (when the question came: timings count from
    here) when it is asked of the session (``SessionCore.ask``).
    """

    request_id: str
    question: str
    frames: list[Frame]  # pinned until the answer ends
    audio: AudioSegment | None
    sampling: Sampling
    item_id: str = ""  # the conversation item the answer is
    modalities: list[str] = field(default_factory=lambda: ["text"])
    instructions: str | None = None  # replaces the system prompt for this answer only
    spoken: str = ""  # the question's words that were speech (transcribed): usage's audio tokens
    trigger: WatchTrigger | None = None  # what started it when no question did (a watch)
    input_ids: list[str] = field(default_factory=list)  # the items its question is made of
    in_conversation: bool = True  # false: its question and answer do not join the timeline
    context: list[InputMessage] | None = None  # its own context instead of the timeline
    metadata: dict[str, str] | None = None  # the client's, echoed
    after_silence: bool = False  # started by the idle timeout (which then waits for the next answer)
    asked_by: Origin | None = None  # the client event that asked for it: its errors name that event
    # the prompt
    used: list[Frame] = field(default_factory=list)  # the frames its prompt holds
    origin: Frame | None = None  # the session's first frame: the prompt's times count from it
    prompted: bool = False
    # asked of the session
    received: float = 0.0
    previous_item_id: str | None = None  # the conversation item its own follows
    # the client's edits while it runs
    heard_ms: int | None = None  # truncated: the audio the client played
    deleted: bool = False  # deleted: it does not join the timeline
    # its run and end
    phase: AnswerPhase = AnswerPhase.ASKED
    outcome: Outcome | None = None
    finished: Finished | None = None
    ttft_s: float | None = None
    first_audio_s: float | None = None
    audio_pieces: list[tuple[float, str]] = field(default_factory=list)  # (audio ms so far, words)
    stopped_by: str | None = None  # what stopped it: one of ``CAUSES``
    error_code: str | None = None  # the error sent for a failed one
    _text: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self._text)

    def _require(self, phase: AnswerPhase, action: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"answer {self.request_id}: cannot {action} when {self.phase.value}")

    # ------------------------------------------------------------------ before it starts
    def transcribed(self, transcript: str) -> QuestionTranscribed:
        """The question's audio was recognised: its words come before any typed text and
        replace the audio. Returns the ``input_audio.transcript`` event."""
        if self.audio is None:
            raise IllegalTransition(f"answer {self.request_id}: no audio to transcribe")
        audio_ms = round(len(self.audio.pcm16) / 2 * 1000 / RATE, 1)
        self.question = "\n".join(part for part in (transcript.strip(), self.question.strip()) if part)
        self.spoken = "\n".join(part for part in (transcript.strip(), self.spoken) if part)
        self.audio = None
        return QuestionTranscribed(request_id=self.request_id, transcript=transcript, audio_ms=audio_ms)

    def start_event(self) -> AnswerStarted:
        """The ``AnswerStarted`` this answer begins with."""
        return AnswerStarted(request_id=self.request_id, modalities=self.modalities, trigger=self.trigger,
                             item_id=self.item_id or None, metadata=self.metadata,
                             in_conversation=self.in_conversation, previous_item_id=self.previous_item_id)

    def start(self) -> list[Event]:
        """Returns ``[AnswerStarted]``. Raises ``IllegalTransition`` unless just asked."""
        self._require(AnswerPhase.ASKED, "start")
        self.phase = AnswerPhase.STARTED
        return [self.start_event()]

    def withdraw(self) -> None:
        """The answer will not start (nothing of it was sent). Raises unless just asked."""
        self._require(AnswerPhase.ASKED, "be withdrawn")
        self.phase = AnswerPhase.WITHDRAWN

    # ------------------------------------------------------------------ while it runs
    def consumed(self) -> FramesConsumed:
        """The ``video.frames.consumed`` event: exactly the frames in the prompt. ``frames``
        has one entry per frame (an unnamed one: ``frame_id`` null, known by its ``seq``);
        ``frame_ids`` only the ids clients gave, so it never holds a null."""
        origin = self.origin or (self.used[0] if self.used else None)
        frames = [
            ConsumedFrame(
                frame_id=f.frame_id, seq=f.seq, pts_ms=f.pts_ms, source_pts_ms=f.source_pts_ms,
                capture_ts_ms=f.capture_ts_ms, server_receive_ts_ms=f.receive_ts_ms, decoded_ts_ms=f.decoded_ts_ms,
                decode_ms=f.decode_ms, timestamp_s=round(frame_time_s(f, origin), 3) if origin is not None else 0.0,
            )
            for f in self.used
        ]
        pts = [f.pts_ms for f in self.used if f.pts_ms is not None]
        return FramesConsumed(
            request_id=self.request_id,
            frame_ids=[f.frame_id for f in self.used if f.frame_id is not None],
            frames=frames,
            latest_pts_ms=max(pts) if pts else None,
        )

    def output(self, out: EngineEvent, now: float) -> list[Event]:
        """The events for one engine output: the frames consumed (first output only), then a
        text delta for text. Engine audio is not sent from here: it goes through ``audio``
        when the session passes it on. Raises ``IllegalTransition`` unless started and
        unfinished (``Finished`` is the engine's last output)."""
        self._require(AnswerPhase.STARTED, "take engine output")
        if self.finished is not None:
            raise IllegalTransition(f"answer {self.request_id}: engine output after it finished")
        events: list[Event] = []
        if self.ttft_s is None:
            self.ttft_s = now - self.received
            events.append(self.consumed())
        if isinstance(out, TextDelta):
            self._text.append(out.text)
            events.append(AnswerTextDelta(request_id=self.request_id, delta=out.text))
        elif isinstance(out, Finished):
            self.finished = out
        elif not isinstance(out, AudioChunk):
            raise TypeError(f"not an engine output: {type(out).__name__}")
        return events

    def audio_out(self, wav: bytes, now: float, words: str = "") -> list[Event]:
        """One piece of the answer's speech (a 24 kHz WAV, saying ``words``; empty: the
        engine's own voice) as its delta event; a truncation finds what was heard by these
        pieces. Raises ``IllegalTransition`` unless started: no audio of an answer follows
        its end."""
        self._require(AnswerPhase.STARTED, "send audio")
        if self.first_audio_s is None:
            self.first_audio_s = now - self.received
        ms = max(0, len(wav) - 44) / 2 / 24  # PCM16 at 24 kHz after the 44-byte header
        total = self.audio_pieces[-1][0] if self.audio_pieces else 0.0
        self.audio_pieces.append((round(total + ms, 1), words))
        return [AnswerAudioDelta(request_id=self.request_id, data=base64.b64encode(wav).decode("ascii"))]

    def stop(self, cause: str) -> None:
        """Something stopped the answer (``CAUSES``); the first cause is the one its end tells."""
        if cause not in CAUSES:
            raise ValueError(f"not a cause an answer stops for: {cause!r}")
        self.stopped_by = self.stopped_by or cause

    @property
    def stopping(self) -> bool:
        """True once something stopped it (its end is on its way)."""
        return self.stopped_by is not None

    # ------------------------------------------------------------------ its end
    def end(self, outcome: Outcome, now: float, error_code: str | None = None) -> list[Event]:
        """The closing events: the whole text (when completed or any was made), audio done
        (when any audio was sent), then ``AnswerEnded`` with usage and timings, and why it
        ended when it did not complete (``interrupted_by``: what stopped it, else the
        session's end; ``error_code``: the error sent for a failed one).

        Raises ``IllegalTransition`` unless started (so there is exactly one end per start),
        and for ``COMPLETED`` without the engine's ``Finished``.
        """
        self._require(AnswerPhase.STARTED, "end")
        if outcome is Outcome.COMPLETED and self.finished is None:
            raise IllegalTransition(f"answer {self.request_id}: completed without the engine finishing")
        self.phase, self.outcome = AnswerPhase.ENDED, outcome
        if outcome is Outcome.FAILED:
            self.error_code = error_code or "internal_error"
        events: list[Event] = []
        text = self.text
        if outcome is Outcome.COMPLETED or text:
            events.append(AnswerTextDone(request_id=self.request_id, text=text))
        if self.first_audio_s is not None:
            events.append(AnswerAudioDone(request_id=self.request_id))
        if outcome is Outcome.COMPLETED:
            reason: str | None = self.finished.finish_reason
        else:
            reason = "abort" if outcome is Outcome.INTERRUPTED else "error"
        usage = Usage(**asdict(self.finished.usage)) if self.finished is not None else Usage()
        timings = Timings(
            ttft_ms=None if self.ttft_s is None else _ms(self.ttft_s),
            first_audio_ms=None if self.first_audio_s is None else _ms(self.first_audio_s),
            total_ms=_ms(now - self.received),
        )
        events.append(AnswerEnded(
            request_id=self.request_id, status=outcome.value, finish_reason=reason, usage=usage, timings=timings,
            trigger=self.trigger,
            interrupted_by=(self.stopped_by or "session_end") if outcome is Outcome.INTERRUPTED else None,
            error_code=self.error_code,
        ))
        return events

    @property
    def kept_text(self) -> str | None:
        """What the timeline keeps of an ended answer: its text, or None when it failed."""
        if self.phase is not AnswerPhase.ENDED:
            raise IllegalTransition(f"answer {self.request_id}: not ended")
        return None if self.outcome is Outcome.FAILED else self.text

    @property
    def audio_ms(self) -> float:
        """How much of its speech was sent, in ms."""
        return self.audio_pieces[-1][0] if self.audio_pieces else 0.0
