"""The pure session core, selection and prompt building, driven without socket or engine."""

from __future__ import annotations

import pytest
from PIL import Image

from handlers.core import Limits, Phase, SessionCore
from handlers.errors import ErrorCode, SessionError
from handlers.frames import Frame, content_key
from handlers.prompt import Exchange, build_prompt
from handlers.protocol import SessionConfig, VideoFrame, VideoQuery, parse_client_event
from handlers.selection import select_frames
from handlers.similarity import thumbnail
from server.engines.base import AudioSegment, Capabilities, ImageSegment, TextSegment
from tests.conftest import b64, jpeg_frame

LIMITS = Limits(
    max_frame_bytes=10_000, max_audio_bytes=100, max_queue=10, idle_timeout_s=5, max_history_turns=2,
    max_answer_tokens=64,
)


def _core(warm: bool = False, **config) -> SessionCore:
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m", warm_prefix=warm))
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


def test_frame_size_checked_before_decoding() -> None:
    """An oversized frame raises frame_too_large with its frame_id."""
    core = _core()
    with pytest.raises(SessionError) as err:
        core.check_frame_size(VideoFrame(type="video.frame", data="A" * 20_000, frame_id=7))
    assert err.value.code is ErrorCode.FRAME_TOO_LARGE and err.value.frame_id == "7"


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
    assert err.value.code is ErrorCode.AUDIO_OVERFLOW and len(core.audio) == 0


def test_query_plan_pins_frames_and_takes_audio() -> None:
    """A planned query pins its frames and takes the buffered audio once."""
    core = _core()
    _feed(core, 1, "a")
    core.add_audio(b64(b"\x01\x00" * 10))
    plan = core.plan_query(VideoQuery(type="video.query", text="hi", audio_data=b64(b"\x02\x00")))
    assert plan.audio is not None and len(plan.audio.pcm16) == 22 and not core.audio
    assert all(f.pins == 1 for f in plan.frames)
    core.finish(plan, "answer")
    assert core.history == [Exchange("hi", "answer")]


def test_query_with_no_frames() -> None:
    """No frame buffered: no_frames."""
    with pytest.raises(SessionError) as err:
        _core().plan_query(VideoQuery(type="video.query", text="?"))
    assert err.value.code is ErrorCode.NO_FRAMES


def test_select_frames_spreads_and_keeps_newest() -> None:
    """Sampling spreads over the buffer and always includes the newest frame."""
    frames = [_frame(i) for i in range(10)]
    assert [f.seq for f in select_frames(frames, 4, use_all=False)] == [0, 3, 6, 9]
    assert [f.seq for f in select_frames(frames, 1, use_all=False)] == [9]
    assert len(select_frames(frames, 4, use_all=True)) == 10
    assert len(select_frames(frames[:2], 4, use_all=False)) == 2


def test_prompt_layout_and_prefix() -> None:
    """System, history as text, then timestamped frames, audio, question; the prefix is a true prefix."""
    frames = [_frame(i, pts=500.0 * i) for i in range(3)]
    for f in frames:
        f.image = Image.new("RGB", (4, 4))
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
    frame.image = Image.new("RGB", (4, 4))
    prompt = build_prompt(system_prompt=None, history=[], frames=[frame], origin=frame, timestamps=False, question="q")
    assert [type(s) for s in prompt.turns[-1].segments] == [ImageSegment, TextSegment]


def test_parse_errors_have_codes() -> None:
    """The parser maps each kind of bad message to its code."""
    cases = {"{": ErrorCode.INVALID_JSON, "3": ErrorCode.INVALID_MESSAGE, '{"type":"x"}': ErrorCode.UNKNOWN_TYPE,
             '{"type":"video.query","text":5}': ErrorCode.INVALID_MESSAGE,
             '{"type":"session.config","max_frames":0}': ErrorCode.INVALID_CONFIG}
    for raw, code in cases.items():
        with pytest.raises(SessionError) as err:
            parse_client_event(raw)
        assert err.value.code is code, raw
