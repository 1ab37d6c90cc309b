"""A session's turns and answers as pure state: what runs on the engine, and what to send.

``Turns`` is the one state of a session's engine work, moved only by the transition table
``TRANSITIONS``; a move the table does not hold raises ``IllegalTransition`` (a bug, never a
client's fault):

    state      trigger   next        when
    idle       warm      warming     frames arrived and no answer runs: a prefill starts
    idle       ask       answering   a question came and nothing runs
    warming    warmed    idle        the prefill ended (done, failed or stopped)
    warming    ask       draining    a question came during a prefill: the prefill is stopped
    draining   warmed    answering   the stopped prefill has ended: the answer may start
    draining   withdraw  warming     the question was dropped (no usable frame, session ending)
                                     while the prefill still ends
    answering  withdraw  idle        the question was dropped before its answer started
    answering  end       idle        the answer sent its end (completed, interrupted or failed)

So no prefill starts while a question is asked or answered, an answer's generation never
overlaps a prefill, and one answer runs at a time (the adapter interrupts the running one,
and waits for its end, before it asks again).

``Answer`` is one answer from its start to its end: it turns each engine output into the
server events to send and guarantees exactly one end (``response.done``, after the text and
audio "done" events) per start, with usage and timings. Its own phases: asked -> started ->
ended, or asked -> withdrawn (nothing was sent). Times are passed in (seconds on one
monotonic clock), so the whole lifecycle runs in tests without a socket, an engine or a clock.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import asdict
from enum import Enum

from handlers.wire.protocol import (
    FramesConsumed,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTrigger,
    ResponseTextDone,
    ServerEvent,
    Timings,
    UsageInfo,
)
from server.engines.base import AudioChunk, EngineEvent, Finished, TextDelta


class IllegalTransition(RuntimeError):
    """A move that the lifecycle does not allow: a bug in the code driving it."""


class TurnState(Enum):
    IDLE = "idle"  # nothing runs: a prefill may start
    WARMING = "warming"  # a prefill extends the engine's cached prefix
    DRAINING = "draining"  # a question waits for the prefill it stopped to end
    ANSWERING = "answering"  # one answer is asked or running, until its end is sent


class Trigger(Enum):
    WARM = "warm"
    WARMED = "warmed"
    ASK = "ask"
    WITHDRAW = "withdraw"
    END = "end"


S, T = TurnState, Trigger
#: Every allowed move: (state, trigger) -> next state. Anything else is a bug.
TRANSITIONS: dict[tuple[TurnState, Trigger], TurnState] = {
    (S.IDLE, T.WARM): S.WARMING,
    (S.IDLE, T.ASK): S.ANSWERING,
    (S.WARMING, T.WARMED): S.IDLE,
    (S.WARMING, T.ASK): S.DRAINING,
    (S.DRAINING, T.WARMED): S.ANSWERING,
    (S.DRAINING, T.WITHDRAW): S.WARMING,
    (S.ANSWERING, T.WITHDRAW): S.IDLE,
    (S.ANSWERING, T.END): S.IDLE,
}
del S, T


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


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class Answer:
    """One answer's events from ``response.start`` to its one ``response.done``.

    ``received``: when the question came (timings count from here); ``consumed``: builds the
    ``video.frames.consumed`` event, sent with the first engine output (the prompt's frames
    are known by then).
    """

    def __init__(
        self, request_id: str, modalities: list[str], received: float, consumed: Callable[[], FramesConsumed],
        trigger: ResponseTrigger | None = None, item_id: str | None = None, metadata: dict[str, str] | None = None,
        in_conversation: bool = True, previous_item_id: str | None = None,
    ) -> None:
        self.in_conversation = in_conversation
        self.previous_item_id = previous_item_id  # the conversation item its own follows
        self.request_id = request_id
        self.item_id = item_id  # the conversation item it is (for codecs that show items)
        self.metadata = metadata  # the client's, echoed by codecs that carry it
        self.trigger = trigger  # what started it when no question did (a watch)
        self.modalities = list(modalities)
        self.received = received
        self._consumed = consumed
        self.phase = AnswerPhase.ASKED
        self.outcome: Outcome | None = None
        self.finished: Finished | None = None
        self.ttft_s: float | None = None
        self.first_audio_s: float | None = None
        self._text: list[str] = []

    @property
    def text(self) -> str:
        """The text generated so far."""
        return "".join(self._text)

    def _require(self, phase: AnswerPhase, action: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"answer {self.request_id}: cannot {action} when {self.phase.value}")

    def start(self) -> list[ServerEvent]:
        """Returns ``[response.start]``. Raises ``IllegalTransition`` unless just asked."""
        self._require(AnswerPhase.ASKED, "start")
        self.phase = AnswerPhase.STARTED
        return [ResponseStart(request_id=self.request_id, modalities=self.modalities, trigger=self.trigger,
                              item_id=self.item_id, metadata=self.metadata, in_conversation=self.in_conversation,
                              previous_item_id=self.previous_item_id)]

    def withdraw(self) -> None:
        """The answer will not start (nothing of it was sent). Raises unless just asked."""
        self._require(AnswerPhase.ASKED, "be withdrawn")
        self.phase = AnswerPhase.WITHDRAWN

    def output(self, out: EngineEvent, now: float) -> list[ServerEvent]:
        """The events for one engine output: the frames consumed (first output only), then a
        text delta for text. Engine audio is not sent from here: it goes through ``audio``
        when the session passes it on. Raises ``IllegalTransition`` unless started and
        unfinished (``Finished`` is the engine's last output)."""
        self._require(AnswerPhase.STARTED, "take engine output")
        if self.finished is not None:
            raise IllegalTransition(f"answer {self.request_id}: engine output after it finished")
        events: list[ServerEvent] = []
        if self.ttft_s is None:
            self.ttft_s = now - self.received
            events.append(self._consumed())
        if isinstance(out, TextDelta):
            self._text.append(out.text)
            events.append(ResponseTextDelta(request_id=self.request_id, delta=out.text))
        elif isinstance(out, Finished):
            self.finished = out
        elif not isinstance(out, AudioChunk):
            raise TypeError(f"not an engine output: {type(out).__name__}")
        return events

    def audio(self, wav: bytes, now: float) -> list[ServerEvent]:
        """One piece of the answer's speech (24 kHz WAV) as its delta event. Raises
        ``IllegalTransition`` unless started: no audio of an answer follows its end."""
        self._require(AnswerPhase.STARTED, "send audio")
        if self.first_audio_s is None:
            self.first_audio_s = now - self.received
        return [ResponseAudioDelta(request_id=self.request_id, data=base64.b64encode(wav).decode("ascii"))]

    def end(
        self, outcome: Outcome, now: float, *, interrupted_by: str | None = None, error_code: str | None = None
    ) -> list[ServerEvent]:
        """The closing events: the whole text (when completed or any was made), audio done
        (when any audio was sent), then ``response.done`` with usage and timings, and why it
        ended when it did not complete (``interrupted_by``: cancel, question, speech or
        session_end; ``error_code``: the error sent for a failed one).

        Raises ``IllegalTransition`` unless started (so there is exactly one end per start),
        and for ``COMPLETED`` without the engine's ``Finished``.
        """
        self._require(AnswerPhase.STARTED, "end")
        if outcome is Outcome.COMPLETED and self.finished is None:
            raise IllegalTransition(f"answer {self.request_id}: completed without the engine finishing")
        self.phase, self.outcome = AnswerPhase.ENDED, outcome
        events: list[ServerEvent] = []
        text = self.text
        if outcome is Outcome.COMPLETED or text:
            events.append(ResponseTextDone(request_id=self.request_id, text=text))
        if self.first_audio_s is not None:
            events.append(ResponseAudioDone(request_id=self.request_id))
        if outcome is Outcome.COMPLETED:
            reason: str | None = self.finished.finish_reason
        else:
            reason = "abort" if outcome is Outcome.INTERRUPTED else "error"
        usage = UsageInfo(**asdict(self.finished.usage)) if self.finished is not None else UsageInfo()
        timings = Timings(
            ttft_ms=None if self.ttft_s is None else _ms(self.ttft_s),
            first_audio_ms=None if self.first_audio_s is None else _ms(self.first_audio_s),
            total_ms=_ms(now - self.received),
        )
        events.append(ResponseDone(
            request_id=self.request_id, status=outcome.value, finish_reason=reason, usage=usage, timings=timings,
            trigger=self.trigger,
            interrupted_by=(interrupted_by or "session_end") if outcome is Outcome.INTERRUPTED else None,
            error_code=(error_code or "internal_error") if outcome is Outcome.FAILED else None,
        ))
        return events

    @property
    def kept_text(self) -> str | None:
        """What the timeline keeps of an ended answer: its text, or None when it failed."""
        if self.phase is not AnswerPhase.ENDED:
            raise IllegalTransition(f"answer {self.request_id}: not ended")
        return None if self.outcome is Outcome.FAILED else self.text


class Turns:
    """The state of a session's engine work (see the module docstring for the table).

    ``answer`` is the asked or running answer (in ``answering`` and ``draining``); the prefix
    is ``behind`` when frames came (or left, or an answer ended) since the last prefill began.
    ``on_change`` is called after every change (the adapter wakes its waiters with it).
    """

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.state = TurnState.IDLE
        self.answer: Answer | None = None
        self.behind = False
        self._on_change = on_change

    def _move(self, trigger: Trigger) -> None:
        try:
            self.state = TRANSITIONS[self.state, trigger]
        except KeyError:
            raise IllegalTransition(f"turns: no move from {self.state.value} on {trigger.value}") from None

    def _changed(self) -> None:
        self._on_change()

    # ------------------------------------------------------------------ warmup
    def prefix_behind(self) -> None:
        """The buffer changed: the prefix should be extended once nothing runs."""
        self.behind = True
        self._changed()

    @property
    def warm_due(self) -> bool:
        """True when a prefill should start now: the prefix is behind and nothing runs."""
        return self.behind and self.state is TurnState.IDLE

    def warm(self) -> None:
        """A prefill starts over the buffer as it is now. Raises unless idle."""
        self._move(Trigger.WARM)
        self.behind = False
        self._changed()

    def nothing_to_warm(self) -> None:
        """The prefix turned out to be up to date: the wish is dropped."""
        self.behind = False
        self._changed()

    def warmed(self) -> None:
        """The prefill ended (done, failed or stopped). Raises unless one was running."""
        self._move(Trigger.WARMED)
        self._changed()

    # ------------------------------------------------------------------ answers
    @property
    def answering(self) -> bool:
        """True from a question until its answer's end was sent (or it was withdrawn)."""
        return self.answer is not None

    @property
    def may_generate(self) -> bool:
        """True when the asked answer may start: no prefill runs any more."""
        return self.state is TurnState.ANSWERING

    def ask(self, answer: Answer) -> bool:
        """A question came; returns True when a running prefill must be stopped first (the
        answer may start once ``may_generate``). Raises when an answer is already asked or
        running: the caller interrupts it, and waits for its end, first."""
        self._move(Trigger.ASK)
        self.answer = answer
        self._changed()
        return self.state is TurnState.DRAINING

    def start(self) -> list[ServerEvent]:
        """The asked answer starts; returns ``[response.start]``. Raises while the prefill it
        stopped is still running, or when no answer is asked."""
        if self.state is not TurnState.ANSWERING or self.answer is None:
            raise IllegalTransition(f"turns: cannot start an answer when {self.state.value}")
        return self.answer.start()

    def withdraw(self) -> None:
        """The asked answer will not start (nothing of it was sent)."""
        answer = self.answer
        if answer is None or answer.phase is not AnswerPhase.ASKED:
            raise IllegalTransition("turns: no answer waits to start")
        self._move(Trigger.WITHDRAW)
        answer.withdraw()
        self.answer = None
        self._changed()

    def end(self) -> None:
        """The running answer's end was sent (``Answer.end``): the turn is over and the
        prefix is behind (the answer joined the timeline). Raises unless it ended."""
        answer = self.answer
        if answer is None or answer.phase is not AnswerPhase.ENDED:
            raise IllegalTransition("turns: the answer has not ended")
        self._move(Trigger.END)
        self.answer = None
        self.behind = True
        self._changed()
