"""The turn and answer lifecycle alone (``handlers/core/lifecycle.py``, ``answer.py``): no socket, no engine, no clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from handlers.core import events as ev
from handlers.core.answer import Answer, AnswerPhase, IllegalTransition, Outcome
from handlers.core.events import Event
from handlers.core.lifecycle import TRANSITIONS, Trigger, EngineSlot, SlotState
from server.engines.base import AudioChunk, Finished, Sampling, TextDelta, Usage

_ids = itertools.count(1)


def _answer(received: float = 10.0) -> Answer:
    return Answer(f"resp_{next(_ids)}", "q", [], None, Sampling(), modalities=["text", "audio"], received=received)


def _types(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


# --------------------------------------------------------------------------- the table


def _in_state(state: SlotState) -> EngineSlot:
    """A ``EngineSlot`` brought to ``state`` through allowed moves only."""
    turns = EngineSlot()
    if state in {SlotState.WARMING, SlotState.DRAINING}:
        turns.prefix_behind()
        turns.warm()
    if state in {SlotState.DRAINING, SlotState.ANSWERING}:
        turns.ask(_answer())
    assert turns.state is state
    return turns


def _end(turns: EngineSlot) -> None:
    turns.start()
    turns.answer.end(Outcome.INTERRUPTED, 11.0)
    turns.end()


#: How each trigger is pulled through the public methods.
PULL: dict[Trigger, Callable[[EngineSlot], object]] = {
    Trigger.WARM: EngineSlot.warm,
    Trigger.WARMED: EngineSlot.warmed,
    Trigger.ASK: lambda t: t.ask(_answer()),
    Trigger.WITHDRAW: EngineSlot.withdraw,
    Trigger.END: _end,
}


@pytest.mark.parametrize(("row", "after"), list(TRANSITIONS.items()), ids=[f"{s.value}-{t.value}" for s, t in TRANSITIONS])
def test_every_row_of_the_table_is_a_move(row: tuple[SlotState, Trigger], after: SlotState) -> None:
    """Each (state, trigger) row of the table moves to its next state, holding an answer exactly while one is asked."""
    state, trigger = row
    turns = _in_state(state)
    PULL[trigger](turns)
    assert turns.state is after
    assert turns.answering == (after in {SlotState.ANSWERING, SlotState.DRAINING})


ILLEGAL = [(s, t) for s in SlotState for t in Trigger if (s, t) not in TRANSITIONS]


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL, ids=lambda v: v.value)
def test_moves_outside_the_table_raise_and_change_nothing(state: SlotState, trigger: Trigger) -> None:
    """A move the table does not hold raises IllegalTransition and leaves the state and the answer as they were."""
    turns = _in_state(state)
    answer = turns.answer
    with pytest.raises(IllegalTransition):
        PULL[trigger](turns)
    assert turns.state is state and turns.answer is answer
    assert answer is None or answer.phase is AnswerPhase.ASKED


def test_no_prefill_while_a_question_waits_and_none_twice() -> None:
    """A prefill starts only when idle and behind; a question during one must wait for it to end."""
    turns = EngineSlot()
    assert not turns.warm_due
    turns.prefix_behind()
    assert turns.warm_due
    turns.warm()
    assert not turns.warm_due and not turns.behind
    turns.prefix_behind()  # frames come during the prefill: another one is due after it
    assert turns.ask(_answer()) is True  # the prefill must be stopped
    assert not turns.may_generate and not turns.warm_due
    with pytest.raises(IllegalTransition):
        turns.start()  # generating while the prefill still runs is a bug
    turns.warmed()
    assert turns.may_generate and not turns.warm_due
    _end(turns)
    assert turns.state is SlotState.IDLE and turns.warm_due  # the answer joined the timeline


def test_question_when_idle_needs_no_stop() -> None:
    """A question with nothing running may start at once."""
    turns = EngineSlot()
    assert turns.ask(_answer()) is False and turns.may_generate


# --------------------------------------------------------------------------- one answer


def test_completed_answer_events_in_order_with_usage_and_timings() -> None:
    """Start, frames consumed with the first output, text deltas, then text done and response.done with usage and timings."""
    answer = _answer(received=10.0)
    assert _types(answer.start()) == ["AnswerStarted"]
    first = answer.output(TextDelta("Hel"), 10.25)
    assert _types(first) == ["FramesConsumed", "AnswerTextDelta"]
    assert _types(answer.output(TextDelta("lo"), 10.3)) == ["AnswerTextDelta"]
    assert answer.output(Finished("stop", Usage(prompt_tokens=7, cached_tokens=5, completion_tokens=2)), 10.4) == []
    end = answer.end(Outcome.COMPLETED, 11.0)
    assert _types(end) == ["AnswerTextDone", "AnswerEnded"]
    assert end[0].text == "Hello"
    done = end[-1]
    assert (done.status, done.finish_reason) == ("completed", "stop")
    assert (done.usage.prompt_tokens, done.usage.cached_tokens, done.usage.completion_tokens) == (7, 5, 2)
    assert done.timings.ttft_ms == 250.0 and done.timings.first_audio_ms is None and done.timings.total_ms == 1000.0
    assert first[0].request_id == answer.request_id and answer.kept_text == "Hello"


def test_interrupted_before_any_output_sends_only_done() -> None:
    """An answer cancelled before the engine said anything ends with response.done interrupted (abort), nothing else."""
    answer = _answer()
    answer.start()
    end = answer.end(Outcome.INTERRUPTED, 10.5)
    assert _types(end) == ["AnswerEnded"]
    assert (end[0].status, end[0].finish_reason, end[0].timings.ttft_ms) == ("interrupted", "abort", None)
    assert answer.kept_text == ""


def test_interrupted_answer_keeps_its_partial_text_and_any_usage() -> None:
    """Cancelled after some text (even after the engine finished): the text so far is done, the usage is kept."""
    answer = _answer()
    answer.start()
    answer.output(TextDelta("half"), 10.1)
    answer.output(Finished("stop", Usage(prompt_tokens=3, completion_tokens=1)), 10.2)
    end = answer.end(Outcome.INTERRUPTED, 10.3)  # speech was still being finished when the cancel came
    assert _types(end) == ["AnswerTextDone", "AnswerEnded"]
    assert end[0].text == "half" and end[1].status == "interrupted" and end[1].usage.prompt_tokens == 3
    assert answer.kept_text == "half"


def test_an_interrupted_answer_tells_the_first_cause_and_a_failed_one_its_code() -> None:
    """response.done names what stopped an answer (the first cause given) or the error a failed one sent."""
    answer = _answer()
    answer.start()
    answer.stop("speech")
    answer.stop("cancel")  # a second stop while it ends does not change why it ended
    assert answer.stopping
    assert answer.end(Outcome.INTERRUPTED, 10.2)[-1].interrupted_by == "speech"
    failed = _answer()
    failed.start()
    done = failed.end(Outcome.FAILED, 10.2, error_code="engine_error")[-1]
    assert (done.interrupted_by, done.error_code) == (None, "engine_error")
    with pytest.raises(ValueError):
        _answer().stop("boredom")


def test_failed_answer_keeps_no_text() -> None:
    """A failed answer ends failed (reason error) and leaves nothing for the timeline."""
    answer = _answer()
    answer.start()
    answer.output(TextDelta("x"), 10.1)
    end = answer.end(Outcome.FAILED, 10.2)
    assert end[-1].status == "failed" and end[-1].finish_reason == "error"
    assert answer.kept_text is None


def test_audio_is_timed_and_closed_before_done() -> None:
    """Speech deltas carry base64 WAV; the first sets first_audio_ms; audio done comes before response.done."""
    answer = _answer(received=10.0)
    answer.start()
    assert _types(answer.output(AudioChunk(b"RIFFxxxx"), 10.1)) == ["FramesConsumed"]
    delta = answer.audio_out(b"RIFFwav", 10.2)
    assert _types(delta) == ["AnswerAudioDelta"] and delta[0].data == "UklGRndhdg=="
    answer.output(Finished("stop", Usage()), 10.3)
    end = answer.end(Outcome.COMPLETED, 10.5)
    assert _types(end) == ["AnswerTextDone", "AnswerAudioDone", "AnswerEnded"]
    assert end[-1].timings.first_audio_ms == 200.0
    with pytest.raises(IllegalTransition):
        answer.audio_out(b"late", 10.6)  # nothing of an answer is sent after its end


@pytest.mark.parametrize("misuse", [
    "start twice", "end twice", "end before start", "output before start", "output after end",
    "output after finished", "completed unfinished", "withdraw after start", "kept text before end",
])
def test_misuse_of_an_answer_raises(misuse: str) -> None:
    """Every out-of-order use of an answer is a bug: it raises instead of sending a second or stray event."""
    answer = _answer()
    if misuse == "end before start":
        with pytest.raises(IllegalTransition):
            answer.end(Outcome.INTERRUPTED, 1)
        return
    if misuse == "output before start":
        with pytest.raises(IllegalTransition):
            answer.output(TextDelta("x"), 1)
        return
    answer.start()
    actions: dict[str, Callable[[], object]] = {
        "start twice": answer.start,
        "end twice": lambda: (answer.end(Outcome.INTERRUPTED, 1), answer.end(Outcome.FAILED, 2)),
        "output after end": lambda: (answer.end(Outcome.INTERRUPTED, 1), answer.output(TextDelta("x"), 2)),
        "output after finished": lambda: (answer.output(Finished("stop", Usage()), 1), answer.output(TextDelta("x"), 2)),
        "completed unfinished": lambda: answer.end(Outcome.COMPLETED, 1),
        "withdraw after start": answer.withdraw,
        "kept text before end": lambda: answer.kept_text,
    }
    with pytest.raises(IllegalTransition):
        actions[misuse]()


@pytest.mark.parametrize("race", ["cancel", "failure", "disconnect"])
def test_exactly_one_end_when_an_interruption_meets_the_normal_end(race: str) -> None:
    """A cancel, a failure or a dropped client meeting the engine's own end still makes exactly one response.done."""
    turns = EngineSlot()
    turns.ask(_answer())
    answer = turns.answer
    made = list(turns.start())
    made += answer.output(TextDelta("a"), 10.1)
    made += answer.output(Finished("length", Usage(completion_tokens=1)), 10.2)
    outcome = {"cancel": Outcome.INTERRUPTED, "failure": Outcome.FAILED, "disconnect": Outcome.COMPLETED}[race]
    made += answer.end(outcome, 10.3)  # the adapter's one end (made even when the client is gone)
    for late in Outcome:  # whatever ending comes second finds the answer ended
        with pytest.raises(IllegalTransition):
            answer.end(late, 10.4)
    with pytest.raises(IllegalTransition):
        answer.output(TextDelta("b"), 10.4)
    turns.end()
    with pytest.raises(IllegalTransition):
        turns.end()
    types = _types(made)
    assert types.count("AnswerStarted") == 1 and types.count("AnswerEnded") == 1 and types[-1] == "AnswerEnded"
    assert made[-1].status == outcome.value and made[-1].usage.completion_tokens == 1
    assert turns.state is SlotState.IDLE and not turns.answering


def test_withdrawn_question_sends_nothing_and_frees_the_turn() -> None:
    """A question dropped before it started (no usable frame) makes no event and lets the next one be asked."""
    turns = EngineSlot()
    turns.prefix_behind()
    turns.warm()
    turns.ask(_answer())
    turns.withdraw()
    assert turns.state is SlotState.WARMING and not turns.answering
    turns.warmed()
    turns.ask(_answer())
    assert turns.may_generate


# --------------------------------------------------------------------------- random sequences


class LifecycleMachine(RuleBasedStateMachine):
    """Random triggers, legal or not: illegal ones raise and change nothing; every start gets one end."""

    def __init__(self) -> None:
        super().__init__()
        self.slot = EngineSlot()
        self.now = 0.0
        self.sent: list[Event] = []
        self.asked = 0

    def _snapshot(self) -> tuple[object, ...]:
        answer = self.slot.answer
        return self.slot.state, self.slot.behind, answer, answer and answer.phase

    def _try(self, action: Callable[[], object]) -> object:
        before = self._snapshot()
        try:
            return action()
        except IllegalTransition:
            assert self._snapshot() == before
            return None

    def _tick(self) -> float:
        self.now += 0.01
        return self.now

    @rule()
    def frames_arrive(self) -> None:
        self.slot.prefix_behind()

    @rule()
    def warm(self) -> None:
        legal = (self.slot.state, Trigger.WARM) in TRANSITIONS
        self._try(self.slot.warm)
        assert not legal or self.slot.state is SlotState.WARMING

    @rule()
    def warmed(self) -> None:
        self._try(self.slot.warmed)

    @rule()
    def ask(self) -> None:
        before = self.slot.state
        self._try(lambda: self.slot.ask(_answer(self.now)))
        if (before, Trigger.ASK) in TRANSITIONS:
            self.asked += 1
            assert self.slot.state is TRANSITIONS[before, Trigger.ASK]

    @rule()
    def withdraw(self) -> None:
        self._try(self.slot.withdraw)

    @rule()
    def start(self) -> None:
        events = self._try(self.slot.start)
        self.sent += events or []

    @rule(out=st.sampled_from(["text", "audio", "finished"]))
    def engine_output(self, out: str) -> None:
        answer = self.slot.answer
        if answer is None:
            return
        made = {"text": TextDelta("w "), "audio": AudioChunk(b"RIFF"), "finished": Finished("stop", Usage())}[out]
        self.sent += self._try(lambda: answer.output(made, self._tick())) or []

    @rule()
    def speech(self) -> None:
        answer = self.slot.answer
        if answer is not None:
            self.sent += self._try(lambda: answer.audio_out(b"RIFF", self._tick())) or []

    @rule(outcome=st.sampled_from(Outcome))
    def end(self, outcome: Outcome) -> None:
        answer = self.slot.answer
        if answer is not None:
            self.sent += self._try(lambda: answer.end(outcome, self._tick())) or []

    @rule()
    def turn_over(self) -> None:
        self._try(self.slot.end)

    @invariant()
    def state_and_answer_agree(self) -> None:
        answering = self.slot.state in {SlotState.ANSWERING, SlotState.DRAINING}
        assert self.slot.answering == answering
        assert not self.slot.warm_due or self.slot.state is SlotState.IDLE

    @invariant()
    def events_are_well_formed(self) -> None:
        open_id: str | None = None
        for event in self.sent:
            if isinstance(event, ev.AnswerStarted):
                assert open_id is None, "a second start before the first one's end"
                open_id = event.request_id
            else:
                assert event.request_id == open_id, f"{type(event).__name__} outside its answer"
                if isinstance(event, ev.AnswerEnded):
                    open_id = None

    @precondition(lambda self: self.slot.answer is not None)
    @rule()
    def finish_properly(self) -> None:
        """The adapter's way out of any state: end (or withdraw) the answer, then the turn."""
        answer = self.slot.answer
        if answer.phase is AnswerPhase.ASKED:
            self.slot.withdraw()
            return
        if answer.phase is AnswerPhase.STARTED:
            self.sent += answer.end(Outcome.INTERRUPTED, self._tick())
        self.slot.end()

    def teardown(self) -> None:
        starts = sum(isinstance(e, ev.AnswerStarted) for e in self.sent)
        dones = sum(isinstance(e, ev.AnswerEnded) for e in self.sent)
        open_answer = self.slot.answer is not None and self.slot.answer.phase is AnswerPhase.STARTED
        assert dones == starts - open_answer


LifecycleMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_random_trigger_sequences_keep_one_end_per_start = LifecycleMachine.TestCase
test_random_trigger_sequences_keep_one_end_per_start.__doc__ = (
    "Hypothesis-generated trigger sequences: illegal moves raise and change nothing; every start has one end, in order."
)
