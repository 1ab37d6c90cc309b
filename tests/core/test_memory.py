"""The core's memory decisions as tables: which frames become moments, what is noted, a
question about a range, a search run as rounds of checks a question can stop, forgetting."""

from __future__ import annotations

import numpy as np
import pytest

from handlers.core.effects import (
    Caption,
    Captioned,
    Check,
    Checked,
    FindMemory,
    ForgetMemory,
    KeepCaption,
    KeepMoment,
    KeepNote,
    LoadMoments,
    MemoryForgotten,
    MemoryFound,
    MomentsLoaded,
    Prefill,
    Recall,
    Recalled,
    Send,
    StartAnswer,
    Stop,
    Tally,
)
from handlers.core.events import ErrorReported, FramesConsumed, MemoryCleared, MemoryProgress, MemoryResults
from handlers.core.memory import Keyframes, RecalledMoment, resolve_range
from handlers.core.negotiation import MemoryPolicy
from handlers.media.similarity import normalised_thumbnail
from handlers.wire.errors import SessionError
from tests.core.run_core import At, Handle, Read, Reply, Warm, ask, client, frame, machine, run_core
from server.engines.base import Prompt, TextSegment
from tests.protocol_client import jpeg_frame

POLICY = MemoryPolicy(keyframe_s=10.0, min_keyframe_s=0.5, scene_similarity=0.1, caption_tokens=0)
CAPTIONED = MemoryPolicy(keyframe_s=10.0, min_keyframe_s=0.5, scene_similarity=0.1, caption_tokens=6)


def _text(prompt: Prompt) -> str:
    return "".join(s.text for turn in prompt.turns for s in turn.segments if isinstance(s, TextSegment))


def _thumb(value: int):  # noqa: ANN202 - a normalised thumbnail
    return normalised_thumbnail(np.full((24, 32, 3), value, np.uint8))


def test_keyframes_are_the_first_frame_each_scene_change_and_one_every_keyframe_s() -> None:
    """The same picture within keyframe_s is no moment; another picture is, but not within min_keyframe_s of the
    last; after keyframe_s the same one is; a frame with no thumbnail counts only by time."""
    keys = Keyframes(POLICY)
    same, other = _thumb(40), _thumb(220)
    assert [keys.take(same, 0), keys.take(same, 5_000), keys.take(other, 6_000), keys.take(same, 6_100),
            keys.take(other, 15_000), keys.take(other, 16_001), keys.take(None, 17_000)] == [
        True, False, True, False, False, True, False]


def test_a_range_is_resolved_against_now_and_refused_when_empty() -> None:
    """Negative times are before now, absent ones the start and now; an empty range is refused."""
    assert resolve_range(-60_000, None, 1_000_000) == (940_000, 1_000_000)
    assert resolve_range(None, -1_000, 1_000_000) == (0.0, 999_000)
    with pytest.raises(SessionError):
        resolve_range(5, 4, 10)


def _moment(moment_id: int, start: float) -> RecalledMoment:
    return RecalledMoment(moment_id, start, start + 1000, jpeg_frame(moment_id), (320, 240))


def test_frames_keep_moments_and_answers_keep_notes_only_when_the_session_remembers() -> None:
    """Keyframes become KeepMoment, a question and its answer KeepNote; a session or server without memory keeps none."""
    core = machine(memory_policy=POLICY)
    run = run_core([frame(1, 1), frame(1, 2), At(101.0), frame(9, 3), Warm(), *ask("what?"), Warm(), Reply("a cup")], core)
    kept = [e for e in run.effects if isinstance(e, (KeepMoment, KeepNote))]
    assert [type(e).__name__ for e in kept] == ["KeepMoment", "KeepMoment", "KeepNote", "KeepNote"]
    assert [(e.kind, e.text) for e in kept if isinstance(e, KeepNote)] == [("question", "what?"), ("answer", "a cup")]
    for off in (machine(memory_policy=POLICY, memory={"enabled": False}), machine()):
        run = run_core([frame(1, 1), Warm(), *ask("what?"), Reply("x")], off)
        assert not [e for e in run.effects if isinstance(e, (KeepMoment, KeepNote))]


def test_a_question_about_a_range_is_answered_over_its_moments_out_of_the_conversation() -> None:
    """A range asks for its keyframes in the lane; the answer shows them (named and timed as moments), stays out of
    the timeline and releases them at its end."""
    core = machine(memory_policy=POLICY)
    query = client(type="video.query", text="what colour?", range={"from_ms": -60_000})
    run = run_core([frame(1, 1), Warm(), Read(query), Handle(query)], core)
    recall = run.newest(Recall)
    assert recall.to_ms - recall.from_ms == 60_000 and recall.n == 16
    run = run_core([Recalled(query, 0.0, [_moment(4, 10.0), _moment(5, 20.0)], recall.question)], core)
    started = run.newest(StartAnswer)
    assert [f.frame_id for f in started.answer.frames] == ["moment_4", "moment_5"]
    assert not started.answer.in_conversation
    run = run_core([Reply("red")], core)
    consumed = next(e.event for e in run.effects if isinstance(e, Send) and isinstance(e.event, FramesConsumed))
    assert [f.server_receive_ts_ms for f in consumed.frames] == [10.0, 20.0]
    assert started.answer.frames == []  # released at its end
    assert len(core.state.timeline.history) + len(core.state.timeline.turns) == 0  # the timeline is as it was


def test_a_condition_search_runs_in_rounds_a_question_stops_one_and_it_runs_again() -> None:
    """A condition search lists its range, loads a batch, checks it as an engine job; a question stops the round,
    which runs again after the answer; moments gone meanwhile are counted; results are best first."""
    core = machine(memory_policy=POLICY)
    search = client(type="memory.search", search_id="s", condition="Is it blue?", threshold=0.5)
    run = run_core([frame(1, 1), Warm(), Handle(search)], core)
    found = run.newest(FindMemory)
    moments = [_moment(n, n * 1000.0) for n in range(1, 11)]
    run = run_core([MemoryFound(found.run, moments, [])], core)
    assert run.effects[0] == Send(MemoryProgress(search_id="s", checked=0, total=10))
    load = run.newest(LoadMoments)
    assert [m.moment_id for m in load.moments] == list(range(1, 9))
    run = run_core([MomentsLoaded(load.run, load.moments)], core)
    round_ = run.newest(Check).step
    assert round_.search is load.run and len(round_.prompts) == 8
    # a question stops the round; after its answer the same batch is checked again
    run = run_core([*ask("now?")], core)
    assert any(isinstance(e, Stop) for e in run.effects)
    run = run_core([Checked(round_, None), Reply("ok")], core)
    again = run.newest(Check).step
    assert [p[0] for p in again.prompts] == [p[0] for p in round_.prompts]
    run = run_core([Checked(again, [(mid, 0.9 if int(mid) % 2 else 0.1, 1.0) for mid, _ in again.prompts])], core)
    rest = run.newest(LoadMoments)
    run = run_core([MomentsLoaded(rest.run, rest.moments[:1])], core)  # one was deleted meanwhile
    last = run.newest(Check).step
    run = run_core([Checked(last, [(mid, 0.95, 1.0) for mid, _ in last.prompts])], core)
    results = next(e.event for e in run.effects if isinstance(e, Send) and isinstance(e.event, MemoryResults))
    assert results.checked == 9 and results.skipped == 1
    assert [r.moment_id for r in results.results] == [9, 7, 5, 3, 1]  # best first, then newest first


def test_memory_asked_of_a_session_without_it_is_refused_and_forgetting_is_confirmed() -> None:
    """memory_off without memory (server or session), memory_busy for a second search, memory.cleared after a clear."""
    for core in (machine(), machine(memory_policy=POLICY, memory={"enabled": False})):
        search = client(type="memory.search", text="blue")
        run = run_core([Handle(search)], core)
        error = next(e.event for e in run.effects if isinstance(e, Send) and isinstance(e.event, ErrorReported))
        assert error.code == "memory_off"
    core = machine(memory_policy=POLICY)
    run = run_core([Handle(client(type="memory.clear"))], core)
    assert isinstance(run.effects[-1], ForgetMemory)
    run = run_core([MemoryForgotten(3)], core)
    assert [e.event for e in run.effects if isinstance(e, Send)] == [MemoryCleared(deleted=3)]
    busy = client(type="memory.search", condition="Is it?")
    run = run_core([Handle(busy), Handle(busy)], core)
    error = next(e.event for e in run.effects if isinstance(e, Send) and isinstance(e.event, ErrorReported))
    assert error.code == "memory_busy"


def test_each_moment_is_captioned_on_the_warm_prefix_after_the_sessions_own_work() -> None:
    """A keyframe makes its caption due: it runs once the prefix is warm (a silent engine job),
    its words are kept for the moment; a question stops it and it runs again after the answer;
    a caption still waiting when the next moment comes is skipped and counted; a running one
    gives way to a due prefill and runs again after it."""
    core = machine(memory_policy=CAPTIONED)
    run = run_core([frame(1, 1)], core)
    assert not any(isinstance(e, Caption) for e in run.effects)  # the prefill goes first
    run = run_core([Warm()], core)
    step = run.newest(Caption).step
    assert step.tokens == CAPTIONED.caption_tokens and step.prompt.turns[-1].segments[-1].text.endswith(
        CAPTIONED.caption_prompt)
    run = run_core([*ask("what?")], core)
    assert any(isinstance(e, Stop) and e.job is step for e in run.effects)
    run = run_core([Captioned(step, None), Reply("a cup")], core)
    again = run.newest(Caption).step
    assert again is not step and again.at_ms == step.at_ms
    run = run_core([Captioned(again, " a red screen ")], core)
    assert KeepCaption(step.at_ms, "a red screen") in run.effects and Tally("captions") in run.effects
    run = run_core([At(102.0), frame(9, 2), At(104.0), frame(17, 3)], core)
    assert Tally("captions_skipped") in run.effects
    run = run_core([At(104.01), Warm()], core)
    assert [type(e) for e in run.effects] == [Prefill]  # the prefix is behind: its prefill first
    run = run_core([At(104.02), Warm()], core)
    step = run.newest(Caption).step
    run = run_core([At(104.2), frame(33, 4)], core)  # within min_keyframe_s: no moment, but a prefill is due
    assert any(isinstance(e, Stop) and e.job is step for e in run.effects)
    run = run_core([At(104.3), Captioned(step, None)], core)
    assert isinstance(run.effects[0], Prefill)  # the session's own work first
    run = run_core([At(104.4), Warm()], core)
    assert run.newest(Caption).step.at_ms == step.at_ms  # then the caption again


def test_the_captions_of_what_left_the_window_open_the_warm_prefix_and_change_once_per_moment() -> None:
    """Captions of moments that started before the window's first frame go, newest that fit the
    budget, at the start of the timeline, before every frame: in the warm prefix, so a question
    finds them cached. The newest is open-ended, so frames leaving within a moment do not
    change the text."""
    from handlers.core.memory import Earlier

    earlier = Earlier()
    for start, caption in [(1_000.0, "a red  screen"), (11_000.0, "a blue screen"), (21_000.0, "in the window")]:
        earlier.add(start, caption)
    assert earlier.render(21_000.0, 1_000.0, 400) == (
        "Earlier, before these frames:\n[0.0s-10.0s] a red screen\n[10.0s-] a blue screen")
    assert earlier.render(25_000.0, 1_000.0, 400) == (
        "Earlier, before these frames:\n[0.0s-10.0s] a red screen\n[10.0s-20.0s] a blue screen\n[20.0s-] in the window")
    assert earlier.render(21_000.0, 1_000.0, 30) == "Earlier, before these frames:\n[10.0s-] a blue screen"
    assert earlier.render(1_000.0, 1_000.0, 400) is None
    core = machine(memory_policy=CAPTIONED, max_frames=2)
    run = run_core([frame(1, 1), Warm()], core)
    run = run_core([Captioned(run.newest(Caption).step, "a red screen"), At(101.0), frame(9, 2), At(102.0),
                    frame(17, 3), At(103.0), frame(25, 4), Warm()], core)
    warm = [e.step.prompt for e in run.effects if isinstance(e, Prefill)][-1]
    opening = next(t for t in warm.turns if t.role == "user").segments[0]
    assert isinstance(opening, TextSegment)
    assert opening.text == "Earlier, before these frames:\n[0.0s-] a red screen\n"  # before every frame
    run = run_core([*ask("what was before?")], core)
    while not any(isinstance(e, StartAnswer) for e in run.effects):
        run = run_core([Warm()], core)
    prompt = _text(run.newest(StartAnswer).prompt)
    assert prompt.startswith(_text(warm)) and prompt.endswith("what was before?")  # the question adds to it
    run_core([Reply("red")], core)
    assert _text(core.state.warm_prompt()).startswith(prompt)
