"""What goes into a session's core and what comes out: inputs, job results and effects.

The core (``machine.SessionMachine``) is driven by two calls and answers each with effects,
in the order they must be carried out:

    receive(input, now)      a client event read or due in its lane, a frame shed, a timer
                             tick, the executor running, the connection closed
    completed(result, now)   a job the core asked for has ended (or sent a piece of its output)

An executor (the WebSocket adapter, or a session with no socket at all) runs the effects and
feeds the results back. Effects are plain data: ``Send`` an event; run a job (``Prepare`` a
frame, ``Prefill``, ``Check``, ``StartAnswer``, ``DetectSpeech``, ``TranscribeHeld``); feed
or stop the running transcription (``ListenStart``, ``ListenFeed``, ``StopListening``);
``Speak`` text of the running answer; ``Stop`` a running job; ``ResetVad``; ask for a tick
(``Timer``); count (``Tally``); end the session (``EndSession``). Jobs whose results the
lane waits for (``Prepare``, ``DetectSpeech``, ``TranscribeHeld``) are carried out in the
lane that received the input; the engine's jobs run beside it, one at a time, in the
session's task group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Union

from handlers.core.answer import Answer, Outcome
from handlers.core.events import ErrorReported, Event
from handlers.core.jobs import CaptionStep, CheckStep, WarmStep
from handlers.core.memory import RecalledMoment, SearchRun, TextFound
from handlers.media.preparation import PreparedFrame
from handlers.wire.commands import AnswerRequest
from handlers.wire.errors import Origin, SessionError
from handlers.wire.protocol import VideoFrame, VideoQuery
from server.engines.base import EngineEvent, Prompt


@dataclass(frozen=True, slots=True)
class Now:
    """The caller's clocks: ``s``, seconds on one monotonic clock (answers, checks, timers);
    ``wall_ms``, the wall clock in ms (frame timestamps)."""

    s: float
    wall_ms: float

    @classmethod
    def read(cls) -> Now:
        """The clocks of this process, now."""
        return cls(time.monotonic(), time.time() * 1000.0)


# ---------------------------------------------------------------------------- inputs
@dataclass(frozen=True, slots=True)
class Read:
    """A client event just read, before it waits in a lane: control is answered here (ping,
    cancel), and what it interrupts is stopped at once."""

    event: ClientEvent


@dataclass(frozen=True, slots=True)
class Handle:
    """A client event's turn in its lane (``received``: when it was read, ``now``'s clock)."""

    event: ClientEvent
    received: float = 0.0


@dataclass(frozen=True, slots=True)
class FrameShed:
    """A frame dropped at intake because the server cannot keep up."""

    event: VideoFrame


@dataclass(frozen=True, slots=True)
class Tick:
    """A timer the core asked for (``Timer``) is due."""


@dataclass(frozen=True, slots=True)
class Opened:
    """The session's executor runs: its first effects (a voice activity stream, a warm-up)."""


@dataclass(frozen=True, slots=True)
class Closed:
    """A closing error or a close was sent: the session takes nothing more."""


Input = Union[Read, Handle, FrameShed, Tick, Opened, Closed]


# ---------------------------------------------------------------------------- job results
@dataclass(frozen=True, slots=True)
class Prepared:
    """A frame was prepared off the loop (``receive_ms``: when it was read, wall clock)."""

    event: VideoFrame
    frame: PreparedFrame
    receive_ms: float


@dataclass(frozen=True, slots=True)
class Warmed:
    """A prefill ended: ``done`` (it ran to the end), or failed or stopped."""

    step: WarmStep
    done: bool = True


@dataclass(frozen=True, slots=True)
class Checked:
    """A round of checks ended: ``results`` (watch id, probability, ms) when it ran to the
    end, None when it failed or was stopped."""

    step: CheckStep
    results: list[tuple[str, float, float]] | None


@dataclass(frozen=True, slots=True)
class Transcribed:
    """The answer's audio became words."""

    answer: Answer
    transcript: str


@dataclass(frozen=True, slots=True)
class Generated:
    """One output of the engine for the running answer."""

    answer: Answer
    output: EngineEvent


@dataclass(frozen=True, slots=True)
class Spoken:
    """One piece of the answer's synthesized speech (a 24 kHz WAV saying ``words``)."""

    answer: Answer
    wav: bytes
    words: str


@dataclass(frozen=True, slots=True)
class Ended:
    """The answer's job ended: completed, interrupted or failed (``error_code``: the error sent)."""

    answer: Answer
    outcome: Outcome
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class SpeechDetected:
    """The voice activity model's probabilities for the audio of a ``DetectSpeech``."""

    probabilities: list[float]


@dataclass(frozen=True, slots=True)
class HeldTranscribed:
    """A held spoken input's words."""

    item_id: str
    transcript: str


@dataclass(frozen=True, slots=True)
class Recalled:
    """``Recall``'s moments, read back from the store (oldest first)."""

    event: VideoQuery | AnswerRequest
    received: float
    moments: list[RecalledMoment]
    question: str


@dataclass(frozen=True, slots=True)
class MemoryFound:
    """``FindMemory``'s answer: the range's moments (without keyframes) when the search has a
    condition, and the text hits when it has a text."""

    run: SearchRun
    moments: list[RecalledMoment]
    text: list[TextFound]


@dataclass(frozen=True, slots=True)
class MomentsLoaded:
    """``LoadMoments``'s keyframes (a moment gone from the store meanwhile is left out)."""

    run: SearchRun
    moments: list[RecalledMoment]


@dataclass(frozen=True, slots=True)
class Captioned:
    """A caption's job ended: its words, or None when it failed or was stopped."""

    step: CaptionStep
    text: str | None


@dataclass(frozen=True, slots=True)
class MemoryForgotten:
    """``ForgetMemory`` done: ``deleted`` records gone."""

    deleted: int


Result = Union[
    Prepared, Warmed, Checked, Transcribed, Generated, Spoken, Ended, SpeechDetected, HeldTranscribed, Recalled,
    MemoryFound, MomentsLoaded, MemoryForgotten, Captioned,
]


# ---------------------------------------------------------------------------- effects
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``event`` to the client."""

    event: Event


@dataclass(frozen=True, slots=True)
class Tally:
    """Count ``n`` of ``what`` in the session's metrics (frames accepted, filtered, evicted,
    shed; checks run and frames no check looked at)."""

    what: Literal["accepted", "filtered", "evicted", "shed", "checks", "skipped", "captions", "captions_skipped"]
    n: int = 1


@dataclass(frozen=True, slots=True)
class Prepare:
    """Prepare the frame off the loop (a thumbnail, the picture at ``side``), then report
    ``Prepared`` (or ``FrameShed`` when it cannot start within the intake wait of
    ``received``, ``now``'s clock). Done in the frame's lane; ``receive_ms``: when it was read,
    wall clock."""

    event: VideoFrame
    side: int | None
    received: float
    receive_ms: float


@dataclass(frozen=True, slots=True)
class Prefill:
    """Extend the engine's cached prefix with ``step.prompt``; report ``Warmed``."""

    step: WarmStep


@dataclass(frozen=True, slots=True)
class Check:
    """Run one round of watch checks; report ``Checked``."""

    step: CheckStep


@dataclass(frozen=True, slots=True)
class StartAnswer:
    """Run the answer: first its audio becomes words when ``transcribe`` (with the running
    transcription when ``take_listening``: report ``Transcribed``, which gives the prompt),
    else generate from ``prompt`` at once; report each engine output (``Generated``), each
    piece of speech (``Spoken``: a speaker runs when ``speak``) and its end (``Ended``)."""

    answer: Answer
    prompt: Prompt | None
    transcribe: bool = False
    take_listening: bool = False
    speak: bool = False


@dataclass(frozen=True, slots=True)
class Generate:
    """The answer's words are in: generate from ``prompt`` (after ``Transcribed``)."""

    answer: Answer
    prompt: Prompt


@dataclass(frozen=True, slots=True)
class Speak:
    """Text of the running answer for its speaker."""

    answer: Answer
    text: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop a running job: a prefill, a round of checks or an answer (its ``Ended`` follows)."""

    job: WarmStep | CheckStep | CaptionStep | Answer


@dataclass(frozen=True, slots=True)
class DetectSpeech:
    """Judge ``pcm16`` with the voice activity model; report ``SpeechDetected``. In the lane."""

    pcm16: bytes


@dataclass(frozen=True, slots=True)
class ResetVad:
    """Turn detection was switched: open a fresh voice activity stream (``on``) or none."""

    on: bool


@dataclass(frozen=True, slots=True)
class ListenStart:
    """Start transcribing the question being spoken, from stream sample ``start``."""

    start: int


@dataclass(frozen=True, slots=True)
class ListenFeed:
    """More of the question's audio for the running transcription, up to sample ``end``."""

    pcm16: bytes
    end: int


@dataclass(frozen=True, slots=True)
class StopListening:
    """The running transcription is not wanted any more (its audio went elsewhere)."""


@dataclass(frozen=True, slots=True)
class TranscribeHeld:
    """Turn a held spoken input into words (with the running transcription when
    ``take_listening``); report ``HeldTranscribed``. In the lane."""

    item_id: str
    pcm16: bytes
    take_listening: bool


@dataclass(frozen=True, slots=True)
class KeepMoment:
    """Store a keyframe: the frame's bytes as received (kept as the model sees it: at most
    ``side`` pixels a side, JPEG), received at ``at_ms`` (wall clock). Off the loop; never
    waited for."""

    data: bytes
    at_ms: float
    side: int | None


@dataclass(frozen=True, slots=True)
class KeepNote:
    """Store a note of the session (a question, an answer, a transcript, a watch's fire)."""

    kind: Literal["transcript", "question", "answer", "fire"]
    at_ms: float
    text: str


@dataclass(frozen=True, slots=True)
class Caption:
    """Have the engine write a moment's caption (silently: nothing is sent); report
    ``Captioned``. An engine job, stopped by a question like a prefill."""

    step: CaptionStep


@dataclass(frozen=True, slots=True)
class KeepCaption:
    """Store a moment's caption (the moment that starts at ``at_ms``)."""

    at_ms: float
    text: str


@dataclass(frozen=True, slots=True)
class Recall:
    """Read at most ``n`` keyframes spread over ``from_ms``..``to_ms`` for a question about
    the past; report ``Recalled``. In the lane."""

    event: VideoQuery | AnswerRequest
    received: float
    from_ms: float
    to_ms: float
    n: int
    question: str


@dataclass(frozen=True, slots=True)
class FindMemory:
    """Start a search: list its range's moments (for its condition, at most ``limit``) and
    run its text search; report ``MemoryFound``."""

    run: SearchRun
    limit: int


@dataclass(frozen=True, slots=True)
class LoadMoments:
    """Read the keyframes of a search's next batch; report ``MomentsLoaded``."""

    run: SearchRun
    moments: list[RecalledMoment]


@dataclass(frozen=True, slots=True)
class ForgetMemory:
    """Delete everything the session remembers; report ``MemoryForgotten``. In the lane."""


@dataclass(frozen=True, slots=True)
class Timer:
    """Report a ``Tick`` at ``at`` (``now``'s clock); None: no tick is wanted."""

    at: float | None


@dataclass(frozen=True, slots=True)
class EndSession:
    """The client said goodbye (``video.done``) and its last answer has ended: close."""


Effect = Union[
    Send, Tally, Prepare, Prefill, Check, StartAnswer, Generate, Speak, Stop, DetectSpeech, ResetVad,
    ListenStart, ListenFeed, StopListening, TranscribeHeld, Timer, EndSession, KeepMoment, KeepNote, Recall,
    FindMemory, LoadMoments, ForgetMemory, Caption, KeepCaption,
]


def error_event(exc: SessionError, origin: Origin | None = None) -> ErrorReported:
    """The one place a ``SessionError`` becomes an ``error`` event (``origin``: the client
    event it answers, when the error does not name one itself)."""
    return ErrorReported(
        code=exc.code.value, message=exc.message, frame_id=exc.frame_id, closes_session=exc.closes_session,
        retry_after_ms=exc.retry_after_ms, origin=exc.origin or origin, wire_code=exc.wire_code,
    )


@dataclass(frozen=True, slots=True)
class Source:
    """What the session's source does that the core's decisions depend on: whether its
    client commits audio itself (``commits_audio``: the buffer waits for a commit, so no
    transcription streams while it fills), and how much of an engine's own audio to cut at
    the start of each answer (``native_trim_ms``: a codec's start-up artefact)."""

    commits_audio: bool = False
    native_trim_ms: float = 0.0


class Refused(Exception):
    """A ``SessionError`` with the effects that must come before its error event (a
    transcription the failed question would have taken is stopped)."""

    def __init__(self, error: SessionError, effects: list[Effect]) -> None:
        super().__init__(error.message)
        self.error, self.effects = error, effects
