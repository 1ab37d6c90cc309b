"""One answer as data (``handlers/core/answer.py`` through the core): engine outputs in, wire
events out (``tests/core/run_core.py``'s ``run_answer``), and what the answer leaves in the session after it."""

from __future__ import annotations

import pytest

from handlers.core.answer import Outcome
from handlers.core.events import WatchFired
from handlers.core.session_core import SessionCore, VoicePaths
from handlers.core.timeline import interrupted_answer
from handlers.core.watches import Fire, Watch
from handlers.wire.commands import AnswerRequest, TruncateItem
from handlers.wire.protocol import SessionConfig, VideoQuery, WatchSpec
from server.engines.base import Capabilities, Finished, TextDelta, Usage
from server.speech.wav import encode_wav
from tests.core.run_core import Speech, run_answer
from tests.core.items_world import LIMITS, feed_frame


def _core(voice: VoicePaths | None = None) -> SessionCore:
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), voice)
    core.configure(SessionConfig(modalities=["text"]))
    for n in range(3):
        feed_frame(core, n + 1, f"f{n}")
    return core


def _ask(core: SessionCore, text: str = "What is red?"):
    return core.plan_query(VideoQuery(type="video.query", text=text))


def test_a_completed_answer_sends_its_events_in_order_and_joins_the_timeline() -> None:
    """start, frames consumed (exactly the prompt's), the deltas, text done, done with usage; the timeline keeps it."""
    core = _core()
    answer = _ask(core)
    ran = run_answer(core, answer, [TextDelta("A "), TextDelta("cup."), Finished("stop", Usage(12, 4, 2))])
    assert ran.types == ["AnswerStarted", "FramesConsumed", "AnswerTextDelta", "AnswerTextDelta",
                         "AnswerTextDone", "AnswerEnded"]
    consumed, done = ran.events[1], ran.events[-1]
    assert consumed.frame_ids == ["f0", "f1", "f2"] == [f.frame_id for f in answer.used]
    assert (done.status, done.usage.prompt_tokens, done.interrupted_by, done.error_code) == ("completed", 12, None, None)
    assert core.history[-1].question == "What is red?" and core.history[-1].answer == "A cup."
    assert core.running is None and all(f.pins == 0 for f in core.buffer.frames)


def test_an_answer_stopped_by_speech_says_so_and_the_timeline_marks_it() -> None:
    """Interrupted after some text: response.done names speech; the timeline keeps the words, marked as cut."""
    core = _core()
    ran = run_answer(core, _ask(core), [TextDelta("It is")], stop="speech")
    assert ran.types[-2:] == ["AnswerTextDone", "AnswerEnded"]
    assert (ran.events[-1].status, ran.events[-1].interrupted_by) == ("interrupted", "speech")
    assert core.history[-1].answer == interrupted_answer("It is")


def test_a_failed_answer_names_its_error_and_leaves_the_question_open() -> None:
    """A failed answer's done carries the error code sent; nothing of it joins the timeline."""
    core = _core()
    ran = run_answer(core, _ask(core), [TextDelta("x")], error_code="engine_error")
    assert (ran.events[-1].status, ran.events[-1].error_code) == ("failed", "engine_error")
    assert core.history == []


@pytest.mark.parametrize("when", ["while it runs", "after its end"])
def test_a_spoken_answer_truncated_by_the_client_keeps_what_was_heard(when: str) -> None:
    """Two sentences of speech; the client's truncate (conversation.item.truncate, the core's
    TruncateItem) says it played 600 ms of the first one's second, while the answer runs or
    after its end: item_truncated answers it and only the words heard are kept."""
    core = _core(VoicePaths(output="espeak"))
    answer = core.plan_answer(AnswerRequest(modalities=["text", "audio"]))
    assert answer.modalities == ["text", "audio"]
    second = encode_wav(bytes(48 * 1000), 24_000)
    truncate = TruncateItem(item_id=answer.item_id, audio_end_ms=600)
    replies = []

    def outputs():
        yield from [TextDelta("Red cup. Blue pen."), Speech(second, "Red cup."), Speech(second, "Blue pen.")]
        if when == "while it runs":  # after both pieces of audio went out, before the engine's end
            replies.extend(core.apply(truncate))
        yield Finished("stop", Usage())

    ran = run_answer(core, answer, outputs())
    if when == "after its end":
        assert core.timeline.turns[-1].answer == "Red cup. Blue pen."
        replies.extend(core.apply(truncate))
    assert [(type(r).__name__, r.item_id, r.audio_end_ms) for r in replies] == [("ItemTruncated", answer.item_id, 600)]
    assert ran.types.count("AnswerAudioDelta") == 2 and "AnswerAudioDone" in ran.types
    assert answer.audio_ms == 2000.0
    assert core.timeline.turns[-1].answer == "Red"


def test_a_fired_watch_answer_carries_its_trigger() -> None:
    """A watch's answer is asked its fire question; start and done name the watch."""
    core = _core()
    spec = WatchSpec(watch_id="door", condition="Is the screen red?")
    fired = WatchFired(watch_id="door", frame_id="f2", probability=0.97)
    answer = core.plan_watch(Fire(Watch(spec), core.buffer.frames[-1], fired, "What happened?"))
    ran = run_answer(core, answer, [TextDelta("It turned red."), Finished("stop", Usage())])
    assert ran.events[0].trigger.watch_id == "door" and ran.events[-1].trigger.watch_id == "door"
    assert answer.question == "What happened?" and core.history[-1].answer == "It turned red."


def test_asking_while_an_answer_runs_is_refused_and_leaves_it_unharmed() -> None:
    """Asking while another answer runs is a bug in the caller: it raises and the running one is
    unharmed (that the next question waits for the running answer's end on the wire:
    tests/session/test_session_scripted.py)."""
    core = _core()
    first = _ask(core)
    core.ask(first, 0.0)
    with pytest.raises(RuntimeError):
        core.ask(_ask(core, "and now?"), 0.1)
    first.start()
    first.output(Finished("stop", Usage()), 0.2)
    assert core.end_answer(first, Outcome.COMPLETED, 0.3)[-1].status == "completed"
