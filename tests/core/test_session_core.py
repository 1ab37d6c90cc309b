"""The pure session core, the timeline and prompt building, driven without socket or engine."""

from __future__ import annotations

import numpy as np
import pytest

from handlers.core import events as ev
from handlers.media.frame_image import FrameImage
from handlers.core.effects import Handle, Now, Prepare, Send
from handlers.core.machine import SessionMachine
from handlers.core.session_core import Limits, Phase, SessionCore
from handlers.wire.errors import ErrorCode, SessionError
from handlers.core.frames import Frame, content_key
from handlers.core.prompt import Exchange, build_prompt
from handlers.wire.protocol import SessionConfig, VideoFrame, VideoQuery, parse_client_event
from handlers.core.timeline import INTERRUPTED_MARK, Timeline, TimelineTurn
from handlers.media.similarity import thumbnail
from server.engines.base import AudioSegment, Capabilities, ImageSegment, Prompt, TextDelta, TextSegment
from tests.protocol_client import b64, jpeg_frame
from tests.core.run_core import answered, run_answer

LIMITS = Limits(
    max_frame_bytes=10_000, max_audio_bytes=100, max_queue=10, idle_timeout_s=5, max_history_turns=2,
    max_answer_tokens=64,
)


def _core(warm: bool = False, max_images: int | None = None, **config) -> SessionCore:
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m", warm_prefix=warm, max_images=max_images))
    core.configure(SessionConfig(**config))
    return core


def _feed(core: SessionCore, seed: int, frame_id=None, pts_ms=None):
    data = jpeg_frame(seed)
    event = VideoFrame(type="video.frame", data=b64(data), frame_id=frame_id, pts_ms=pts_ms)
    return core.accept_frame(event, data, content_key(data), thumbnail(data), 1000.0 + seed)


def _frame(seq: int, pts: float | None = None) -> Frame:
    return Frame(seq=seq, key=f"k{seq}", data=b"x", receive_ts_ms=1000.0 * seq, frame_id=f"f{seq}", pts_ms=pts)


def test_phase_transitions_are_checked() -> None:
    """A session cannot be configured twice or reopened once closed."""
    core = _core()
    assert core.phase is Phase.READY
    with pytest.raises(RuntimeError):
        core.move_to(Phase.READY)
    core.close()
    with pytest.raises(RuntimeError):
        core.move_to(Phase.READY)


def test_configure_caps_max_tokens_and_notes_missing_audio() -> None:
    """Limits are applied to the config and said in session.ready notes."""
    core = SessionCore("s", LIMITS, Capabilities(name="x", model="m"))
    ready = core.configure(SessionConfig(modalities=["text", "audio"], sampling={"max_tokens": 999}))
    assert ready.config["sampling"]["max_tokens"] == 64 and ready.config["modalities"] == ["text"]
    assert len(ready.notes) == 2


def test_the_window_is_capped_to_the_images_a_prompt_may_carry() -> None:
    """An engine that takes at most 8 images a prompt (vLLM's limit_mm_per_prompt): a session
    asking for 50 frames gets 8, said in a note, at the start and in a later update; the
    buffer keeps 8, so no warm prefix, check or question carries more."""
    core = SessionCore("s", LIMITS, Capabilities(name="x", model="m", warm_prefix=True, max_images=8))
    ready = core.configure(SessionConfig(max_frames=50, num_frames=20))
    assert (ready.config["max_frames"], ready.config["num_frames"]) == (8, 8)
    assert any("8 images" in note for note in ready.notes)
    for seed in range(12):
        _feed(core, seed)
    assert len(core.buffer.frames) == 8
    updated = core.update({"max_frames": 30})
    assert updated.config["max_frames"] == 8 and any("8 images" in note for note in updated.notes)


def test_frame_size_checked_before_decoding() -> None:
    """An oversized frame gets frame_too_large with its frame_id when its turn comes, and the
    core asks for no preparation of it (no base64, hash or decode is spent on it); a frame
    within the limit is sent to be prepared."""
    core = SessionMachine.over(_core())
    now = Now(1.0, 1000.0)
    big = VideoFrame(type="video.frame", data=b64(jpeg_frame(1)) + "A" * 20_000, frame_id=7)
    effects = core.receive(Handle(big, 1.0), now)
    assert [type(e) for e in effects] == [Send]
    assert (effects[0].event.code, effects[0].event.frame_id) == ("frame_too_large", "7")
    small = VideoFrame(type="video.frame", data=b64(jpeg_frame(1)), frame_id=8)
    assert [type(e) for e in core.receive(Handle(small, 1.0), now)] == [Prepare]


def test_filter_and_eviction_in_acks() -> None:
    """Duplicates are filtered in the ack; eviction names the dropped frame."""
    core = _core(max_frames=2)
    assert _feed(core, 1, "a").ack.accepted
    dup = _feed(core, 1, "dup")
    assert dup.frame is None and dup.ack.reason == "filtered"
    _feed(core, 2, "b")
    third = _feed(core, 3, "c")
    assert third.ack.dropped_frame_id == "a" and [f.frame_id for f in third.evicted] == ["a"]
    assert _feed(core, 4).ack is None  # no frame_id, no ack


def test_audio_limits() -> None:
    """Odd-length audio is invalid; overflow clears the buffer."""
    core = _core()
    with pytest.raises(SessionError) as err:
        core.add_audio(b64(b"abc"))
    assert err.value.code is ErrorCode.INVALID_AUDIO
    core.add_audio(b64(b"\x00" * 80))
    with pytest.raises(SessionError) as err:
        core.add_audio(b64(b"\x00" * 40))
    assert err.value.code is ErrorCode.AUDIO_OVERFLOW and len(core.mic.buffer) == 0


def test_query_plan_pins_frames_and_takes_audio() -> None:
    """A planned query pins its frames and takes the buffered audio once."""
    core = _core()
    _feed(core, 1, "a")
    core.add_audio(b64(b"\x01\x00" * 10))
    plan = core.plan_query(VideoQuery(type="video.query", text="hi", audio_data=b64(b"\x02\x00")))
    assert plan.audio is not None and len(plan.audio.pcm16) == 22 and not core.mic.buffer
    assert all(f.pins == 1 for f in plan.frames)
    for frame in plan.frames:
        frame.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    answered(core, plan, "answer")
    assert core.history == [Exchange("hi", "answer")]


def test_query_with_no_frames() -> None:
    """No frame buffered: no_frames."""
    with pytest.raises(SessionError) as err:
        _core().plan_query(VideoQuery(type="video.query", text="?"))
    assert err.value.code is ErrorCode.NO_FRAMES


def _decoded(core: SessionCore, seed: int, frame_id=None):
    intake = _feed(core, seed, frame_id, pts_ms=500.0 * seed)
    if intake.frame is not None:
        intake.frame.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    return intake


def _ask(core: SessionCore, text: str, answer: str | None = "ok", interrupted: bool = False) -> tuple[Prompt, list]:
    plan = core.plan_query(VideoQuery(type="video.query", text=text))
    if answer is None:  # the engine failed it: nothing of it is kept
        prompt = run_answer(core, plan, [TextDelta("lost")], error_code="engine_error").prompt
    else:
        prompt = answered(core, plan, answer, stop="cancel" if interrupted else None).prompt
    return prompt, [f.frame_id for f in plan.used]


def _segments(prompt: Prompt) -> list:
    """The prompt flattened: role marks and segments, comparable as a sequence."""
    return [item for turn in prompt.turns for item in ((turn.role,), *turn.segments)]


def _is_prefix(prefix: Prompt, full: Prompt) -> bool:
    """The open prefix's segments start the full prompt (its open turn is the last, unclosed)."""
    a, b = _segments(prefix), _segments(full)
    return b[: len(a)] == a


def test_timeline_only_grows_at_its_end() -> None:
    """Follow-ups, frames between turns and an interrupted answer: each prompt and warm prefix
    extends the previous one, answers stay as generated, the interrupted one marked."""
    core = _core(warm=True, enable_frame_filter=False, max_frames=20)
    prompts = []
    for i in range(3):
        _decoded(core, 10 + i, f"f{i}")
    core.warm_frames()
    prompts.append(core.warm_prompt())
    prompts.append(_ask(core, "first?", "one")[0])
    prompts.append(_ask(core, "follow-up?", "two")[0])
    _decoded(core, 20, "f3")
    core.warm_frames()
    prompts.append(core.warm_prompt())
    prompts.append(_ask(core, "and now?", "thr", interrupted=True)[0])
    core.warm_frames()
    prompts.append(core.warm_prompt())
    prompt, used = _ask(core, "last?", "four")
    prompts.append(prompt)
    for before, after in zip(prompts, prompts[1:]):
        closed = Prompt(before.turns[:-1], open_turn=True) if not before.open_turn else before
        assert _is_prefix(closed, after)
    roles = [t.role for t in prompt.turns]
    assert roles == ["system"] + ["user", "assistant"] * 3 + ["user"]
    answers = [t.segments[0].text for t in prompt.turns if t.role == "assistant"]
    assert answers == ["one", "two", f"thr {INTERRUPTED_MARK}"]
    assert used == ["f0", "f1", "f2", "f3"]
    # the frames sit in the turn they arrived before; the follow-up turn holds only its question
    assert [s.text for s in prompt.turns[3].segments] == ["follow-up?"]
    assert sum(isinstance(s, ImageSegment) for s in prompt.turns[5].segments) == 1


def test_num_frames_thins_the_timeline_and_keeps_the_newest() -> None:
    """No prompt holds more than num_frames frames; thinning keeps the span and the newest frame."""
    core = _core(warm=True, enable_frame_filter=False, max_frames=64, num_frames=8)
    for i in range(40):
        _decoded(core, 100 + i, i)
        assert len(core.warm_frames()) <= 8
    _, used = _ask(core, "what?")
    assert len(used) <= 8 and used[0] == 0 and used[-1] == 39
    assert used == sorted(used)
    for i in range(40, 45):
        _decoded(core, 100 + i, i)
    _, used = _ask(core, "and now?")
    assert len(used) <= 8 and used[-1] == 44


def test_num_frames_without_warm_prefix() -> None:
    """prefix_warmup off: the same timeline, num_frames frames over the buffer, newest included."""
    core = _core(warm=False, enable_frame_filter=False)
    assert core.config.num_frames == 4
    for i in range(6):
        _decoded(core, 200 + i, i)
    _, used = _ask(core, "q")
    assert used == [0, 2, 4, 5]


def test_a_slide_holds_the_eviction_until_the_next_window_is_warm_within_its_margin() -> None:
    """An engine that cannot move its prefix: from 7 of 8 frames the next window (frames 4 on)
    is warmed. Not warm yet, the 9th frame is held past max_frames (the margin: 1) and the 10th
    evicts the older half anyway; warm through the newest frame, the 9th evicts at once."""
    for warm_it, buffered in ((False, [9, 6]), (True, [5, 6])):
        core = _core(warm=True, enable_frame_filter=False, max_frames=8)
        for i in range(8):
            _decoded(core, 300 + i, i)
        core.warmed(core.next_warm())  # the current window is warm
        if warm_it:
            step = core.next_slide_warm()
            assert step is not None and step.frames[0].seq == core.buffer.frames[4].seq
            core.warmed(step)
        sizes = []
        for i in (8, 9):
            _decoded(core, 300 + i, i)
            sizes.append(len(core.buffer))
        assert sizes == buffered, warm_it


def test_eviction_folds_old_events_into_bounded_text() -> None:
    """Turns whose frames all left the window become text history, bounded in count and tokens."""
    # a window at the engine's image limit: no frame is held past it while the next one warms
    core = _core(warm=True, max_images=4, enable_frame_filter=False, max_frames=4)
    for i in range(4):
        _decoded(core, 300 + i, i)
    _ask(core, "q1", "a" * 40)
    _ask(core, "q2", "b" * 40)
    for i in range(4, 7):  # the window drops its oldest half: frames 0-3 go
        _decoded(core, 300 + i, i)
    prompt, used = _ask(core, "q3", "c")
    assert used == [4, 5, 6]
    assert [t.role for t in prompt.turns] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert prompt.turns[1].segments == (TextSegment("q1"),)
    timeline = Timeline(num_frames=4, max_history_turns=4, max_history_tokens=15)
    timeline.turns = [TimelineTurn.of([], "q", "x" * 40), TimelineTurn.of([], "r", "y" * 8)]
    timeline.forget_evicted()
    assert [e.question for e in timeline.history] == ["r"]


def test_prompt_layout_and_prefix() -> None:
    """System, history as text, then timestamped frames, audio, question; the prefix is a true prefix."""
    frames = [_frame(i, pts=500.0 * i) for i in range(3)]
    for f in frames:
        f.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    audio = AudioSegment("a", b"\x00\x00")
    history = [Exchange("q1", "a1")]
    full = build_prompt(system_prompt="sys", history=history, frames=frames, origin=frames[0],
                        timestamps=True, audio=audio, question="what now?")
    prefix = build_prompt(system_prompt="sys", history=history, frames=frames, origin=frames[0], timestamps=True)
    assert [t.role for t in full.turns] == ["system", "user", "assistant", "user"]
    user = full.turns[-1].segments
    assert user[0] == TextSegment("[0.0s]") and isinstance(user[1], ImageSegment) and user[4] == TextSegment("[1.0s]")
    assert user[-2] is audio and user[-1] == TextSegment("\nwhat now?")
    assert prefix.open_turn and full.turns[:-1] == prefix.turns[:-1]
    assert user[: len(prefix.turns[-1].segments)] == prefix.turns[-1].segments


def test_prompt_without_timestamps() -> None:
    """frame_timestamps=false leaves only the images."""
    frame = _frame(0)
    frame.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
    prompt = build_prompt(system_prompt=None, history=[], frames=[frame], origin=frame, timestamps=False, question="q")
    assert [type(s) for s in prompt.turns[-1].segments] == [ImageSegment, TextSegment]


def test_parse_errors_have_codes() -> None:
    """The parser maps each kind of bad message to its code: NaN and Infinity are not JSON; a
    lone surrogate (in a value or a key), nesting past 32 levels (or past the interpreter's
    limit) and a binary message are invalid messages."""
    deep = '{"type":"video.query","x":' + "[" * 32 + "]" * 32 + "}"
    cases = {"{": ErrorCode.INVALID_JSON, "3": ErrorCode.INVALID_MESSAGE, '{"type":"x"}': ErrorCode.UNKNOWN_TYPE,
             '{"type":"video.query","text":5}': ErrorCode.INVALID_MESSAGE,
             '{"type":"session.config","max_frames":0}': ErrorCode.INVALID_CONFIG,
             '{"type":"video.query","text":NaN}': ErrorCode.INVALID_JSON,
             '{"type":"video.frame","pts_ms":-Infinity,"data":""}': ErrorCode.INVALID_JSON,
             '{"type":"video.query","text":"\\ud800"}': ErrorCode.INVALID_MESSAGE,
             '{"type":"video.query","\\udfffx":1}': ErrorCode.INVALID_MESSAGE,
             deep: ErrorCode.INVALID_MESSAGE, "[" * 100_000: ErrorCode.INVALID_MESSAGE}
    for raw, code in cases.items():
        with pytest.raises(SessionError) as err:
            parse_client_event(raw)
        assert err.value.code is code, raw
    with pytest.raises(SessionError) as err:
        parse_client_event(b'{"type":"ping"}')
    assert err.value.code is ErrorCode.INVALID_MESSAGE
    assert parse_client_event('{"type":"ping","x":' + "[" * 31 + "]" * 31 + "}").type == "ping"  # 32 levels


def test_frames_consumed_lists_no_null_ids() -> None:
    """Unnamed frames are in ``frames`` (known by ``seq``) but not in ``frame_ids``, which holds no null."""
    core = _core(num_frames=8)
    _decoded(core, 1)
    _decoded(core, 2, "b")
    _decoded(core, 3)
    _decoded(core, 4, 7)
    plan = core.plan_query(VideoQuery(type="video.query", text="?"))
    events = answered(core, plan, "ok").events
    consumed = next(e for e in events if isinstance(e, ev.FramesConsumed)).model_dump()
    assert consumed["frame_ids"] == ["b", 7]
    assert [(f["frame_id"], f["seq"]) for f in consumed["frames"]] == [(None, 0), ("b", 1), (None, 2), (7, 3)]
    unnamed = _core()
    _decoded(unnamed, 5)
    plan = unnamed.plan_query(VideoQuery(type="video.query", text="?"))
    unnamed.settle_frames(plan)
    unnamed.query_prompt(plan)
    consumed = plan.consumed().model_dump()
    assert consumed["frame_ids"] == [] and len(consumed["frames"]) == 1
