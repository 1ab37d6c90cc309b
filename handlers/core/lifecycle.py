"""A session's slot on the engine as pure state: what runs there, a prefill (or a round of
watch checks, which holds the engine as a prefill does) or an answer.

("Turn" in livesight means one party's go in the conversation: a timeline turn, a prompt's
chat turn, the speaker's turn that turn detection finds. The engine's work is a slot.)

``EngineSlot`` is the one state of a session's engine work, moved only by the transition table
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
overlaps a prefill, and one answer runs at a time (the core stops the running one, and
waits for its end, before it asks again).

The answer itself, from its question to its one end, is an ``Answer`` (``answer.py``); the
session core (``SessionCore.ask`` / ``end_answer``) moves both together.
"""

from __future__ import annotations

from enum import Enum

from handlers.core.answer import Answer, AnswerPhase, IllegalTransition
from handlers.core.events import Event


class SlotState(Enum):
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


S, T = SlotState, Trigger
#: Every allowed move: (state, trigger) -> next state. Anything else is a bug.
TRANSITIONS: dict[tuple[SlotState, Trigger], SlotState] = {
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


class EngineSlot:
    """The state of a session's engine work (see the module docstring for the table).

    ``answer`` is the asked or running answer (in ``answering`` and ``draining``); the prefix
    is ``behind`` when frames came (or left, or an answer ended) since the last prefill began.
    """

    def __init__(self) -> None:
        self.state = SlotState.IDLE
        self.answer: Answer | None = None
        self.behind = False

    def _move(self, trigger: Trigger) -> None:
        try:
            self.state = TRANSITIONS[self.state, trigger]
        except KeyError:
            raise IllegalTransition(f"engine slot: no move from {self.state.value} on {trigger.value}") from None


    # ------------------------------------------------------------------ warmup
    def prefix_behind(self) -> None:
        """The buffer changed: the prefix should be extended once nothing runs."""
        self.behind = True

    @property
    def warm_due(self) -> bool:
        """True when a prefill should start now: the prefix is behind and nothing runs."""
        return self.behind and self.state is SlotState.IDLE

    def warm(self) -> None:
        """A prefill starts over the buffer as it is now. Raises unless idle."""
        self._move(Trigger.WARM)
        self.behind = False

    def nothing_to_warm(self) -> None:
        """The prefix turned out to be up to date: the wish is dropped."""
        self.behind = False

    def warmed(self) -> None:
        """The prefill ended (done, failed or stopped). Raises unless one was running."""
        self._move(Trigger.WARMED)

    # ------------------------------------------------------------------ answers
    @property
    def answering(self) -> bool:
        """True from a question until its answer's end was sent (or it was withdrawn)."""
        return self.answer is not None

    @property
    def may_generate(self) -> bool:
        """True when the asked answer may start: no prefill runs any more."""
        return self.state is SlotState.ANSWERING

    def ask(self, answer: Answer) -> bool:
        """A question came; returns True when a running prefill must be stopped first (the
        answer may start once ``may_generate``). Raises when an answer is already asked or
        running: the caller interrupts it, and waits for its end, first."""
        self._move(Trigger.ASK)
        self.answer = answer
        return self.state is SlotState.DRAINING

    def start(self) -> list[Event]:
        """The asked answer starts; returns ``[AnswerStarted]``. Raises while the prefill it
        stopped is still running, or when no answer is asked."""
        if self.state is not SlotState.ANSWERING or self.answer is None:
            raise IllegalTransition(f"engine slot: cannot start an answer when {self.state.value}")
        return self.answer.start()

    def withdraw(self) -> None:
        """The asked answer will not start (nothing of it was sent)."""
        answer = self.answer
        if answer is None or answer.phase is not AnswerPhase.ASKED:
            raise IllegalTransition("engine slot: no answer waits to start")
        self._move(Trigger.WITHDRAW)
        answer.withdraw()
        self.answer = None

    def end(self) -> None:
        """The running answer's end was sent (``Answer.end``): the turn is over and the
        prefix is behind (the answer joined the timeline). Raises unless it ended."""
        answer = self.answer
        if answer is None or answer.phase is not AnswerPhase.ENDED:
            raise IllegalTransition("engine slot: the answer has not ended")
        self._move(Trigger.END)
        self.answer = None
        self.behind = True
