"""The core's conversation items, config updates and answer requests (what the Realtime
codec drives), without socket or engine; and the Realtime codec's translation alone."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from handlers.core import events as ev
from handlers.core.events import AnswerAudioDelta, AnswerEnded, AudioCommitted, Timings
from handlers.wire.commands import (
    AnswerRequest,
    ClearAudio,
    CommitAudio,
    ConfigUpdate,
    DeleteItem,
    RetrieveItem,
    UserInput,
)
from handlers.core.session_core import SessionCore, VoicePaths
from handlers.wire.codec import V1Codec
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import SessionConfig
from handlers.realtime import RealtimeCodec
from handlers.realtime.audio import audio_in, g711_decode, g711_encode
from server.engines.base import Capabilities, TextSegment
from server.speech.wav import encode_wav
from tests.core.items_world import LIMITS
from tests.core.items_world import feed_frame as _feed
from tests.protocol_client import b64
from tests.core.run_core import answered, withdrawn



def _core(**config) -> SessionCore:
    voice = VoicePaths(output="espeak", input="pocketsphinx", vad_window=512, default_voice="en-us")
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), voice)
    core.configure(SessionConfig(**config))
    return core


def _pcm(samples: int) -> str:
    return base64.b64encode(bytes(2 * samples)).decode()


def test_inputs_become_the_next_answers_question_and_audio() -> None:
    """User text and audio items wait for the next answer, which takes them all (once)."""
    core = _core()
    _feed(core, 1, "f1")
    core.apply(UserInput(item_id="a", text="What is this?"))
    core.apply(UserInput(item_id="b", audio=_pcm(160)))
    plan = core.plan_answer(AnswerRequest())
    assert plan.question == "What is this?" and plan.audio is not None and len(plan.audio.pcm16) == 320
    answered(core, plan, "x")
    again = core.plan_answer(AnswerRequest())
    assert again.question == "" and again.audio is None


def test_answer_request_overrides_modalities_tokens_and_instructions_for_one_answer() -> None:
    """Per-answer instructions replace the system prompt, max_tokens is capped by the limit,
    audio is added to text; the session's own settings stay as they were."""
    core = _core(system_prompt="session rules")
    _feed(core, 1, "f1")
    plan = core.plan_answer(AnswerRequest(instructions="just this once", modalities=["audio"], max_tokens=999))
    assert plan.modalities == ["text", "audio"] and plan.sampling.max_tokens == 64
    assert plan.start_event().modalities == ["text", "audio"]
    assert core.query_prompt(plan).turns[0].segments == (TextSegment("just this once"),)
    withdrawn(core, plan)
    plan = core.plan_answer(AnswerRequest())
    assert plan.modalities == ["text"] and core.query_prompt(plan).turns[0].segments == (TextSegment("session rules"),)


def test_no_frames_keeps_the_pending_inputs() -> None:
    """An answer request with no frame raises no_frames and the inputs wait on."""
    core = _core()
    core.apply(UserInput(item_id="a", text="hi"))
    with pytest.raises(SessionError) as err:
        core.plan_answer(AnswerRequest())
    assert err.value.code is ErrorCode.NO_FRAMES
    _feed(core, 1, "f1")
    assert core.plan_answer(AnswerRequest()).question == "hi"


def test_system_items_join_the_instructions_until_deleted() -> None:
    """System items follow the configured system prompt in every prompt, warm prefix included."""
    core = _core(system_prompt="base")
    core.apply(UserInput(item_id="s", role="system", text="extra"))
    assert core.system_text() == "base\n\nextra"
    _feed(core, 1, "f1")
    assert core.warm_prompt(core.warm_frames()).turns[0].segments == (TextSegment("base\n\nextra"),)
    core.apply(DeleteItem(item_id="s"))
    assert core.system_text() == "base"


def test_commit_moves_buffered_audio_into_an_item_and_clear_drops_it() -> None:
    """commit takes the microphone buffer as one item; clear empties the buffer; committing
    nothing is invalid_audio."""
    core = _core()
    core.add_audio(_pcm(100))
    [committed] = core.apply(CommitAudio(item_id="c1"))
    assert isinstance(committed, AudioCommitted) and committed.audio_ms == pytest.approx(6.2, abs=0.1)
    assert not core.mic.buffer
    core.add_audio(_pcm(50))
    core.apply(ClearAudio())
    with pytest.raises(SessionError) as err:
        core.apply(CommitAudio(item_id="c2"))
    assert err.value.code is ErrorCode.INVALID_AUDIO


def test_pending_audio_is_bounded() -> None:
    """Audio items beyond max_audio_bytes are refused with audio_overflow."""
    core = _core()
    core.apply(UserInput(item_id="a", audio=_pcm(400)))
    with pytest.raises(SessionError) as err:
        core.apply(UserInput(item_id="b", audio=_pcm(200)))
    assert err.value.code is ErrorCode.AUDIO_OVERFLOW


def test_frames_are_items_that_can_be_retrieved_and_deleted() -> None:
    """A buffered frame is found by its id: retrieved as a data URL, deleted from the buffer;
    an unknown id is item_not_found."""
    core = _core()
    _feed(core, 1, "f1")
    [item] = core.apply(RetrieveItem(item_id="f1"))
    assert item.kind == "image" and item.image.startswith("data:image/jpeg;base64,")
    core.apply(DeleteItem(item_id="f1"))
    assert len(core.buffer) == 0
    with pytest.raises(SessionError) as err:
        core.apply(DeleteItem(item_id="f1"))
    assert err.value.code is ErrorCode.ITEM_NOT_FOUND


def test_config_update_changes_what_can_change() -> None:
    """An update keeps model and prefix_warmup (with a note), applies the rest, caps tokens,
    turns turn detection on, and refuses an invalid value alone: the valid parts of the same
    update are applied, and one error lists what was not."""
    core = _core()
    [updated] = core.apply(ConfigUpdate(changes={
        "system_prompt": "new", "max_frames": 3, "prefix_warmup": False, "sampling": {"max_tokens": 500},
        "turn_detection": {"silence_ms": 300},
    }))
    assert updated.config["system_prompt"] == "new" and updated.config["max_frames"] == 3
    assert updated.config["prefix_warmup"] is True and updated.config["sampling"]["max_tokens"] == 64
    assert any("prefix_warmup" in note for note in updated.notes)
    assert core.detector is not None and core.buffer.max_frames == 3
    frames = core.config.num_frames
    updated, error = core.apply(ConfigUpdate(changes={"num_frames": 0, "system_prompt": "newer"}, refused=["x: bad"]))
    assert updated.config["system_prompt"] == "newer" and core.config.num_frames == frames
    assert updated.refused[0] == "x: bad" and updated.refused[1].startswith("num_frames")
    assert isinstance(error, ev.ErrorReported) and error.code == "invalid_message" and "num_frames" in error.message


def test_g711_round_trip_and_24khz_input() -> None:
    """mu-law and A-law encode/decode within one quantisation step; 24 kHz PCM becomes 16 kHz."""
    x = (np.sin(np.arange(2400) / 7) * 12000).astype("<i2")
    for fmt in ("audio/pcmu", "audio/pcma"):
        y = np.frombuffer(g711_decode(g711_encode(x.tobytes(), fmt), fmt), "<i2")
        assert np.abs(y.astype(int) - x).max() < 600
    out = base64.b64decode(audio_in(base64.b64encode(x.tobytes()).decode(), "audio/pcm"))
    assert len(out) == 2 * 1600


def test_realtime_codec_strips_the_wav_header_and_reports_cancel_reason() -> None:
    """Audio deltas go out as raw PCM16 at 24 kHz; an answer interrupted after
    response.cancel ends cancelled / client_cancelled."""
    codec = RealtimeCodec("m")
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), VoicePaths(output="espeak"))
    codec.encode(core.configure(SessionConfig()))
    [created] = codec.decode(json.dumps({"type": "response.create", "response": {"output_modalities": ["audio"]}}))
    _feed(core, 1, "f1")
    plan = core.plan_answer(created)
    codec.encode(plan.start_event())
    pcm = np.arange(480, dtype="<i2").tobytes()
    [delta] = codec.encode(AnswerAudioDelta(request_id=plan.request_id, data=b64(encode_wav(pcm, 24_000))))
    assert base64.b64decode(json.loads(delta)["delta"]) == pcm
    codec.decode(json.dumps({"type": "response.cancel"}))
    done = codec.encode(AnswerEnded(request_id=plan.request_id, status="interrupted", timings=Timings(total_ms=1)))
    response = json.loads(done[-1])["response"]
    assert response["status"] == "cancelled" and response["status_details"]["reason"] == "client_cancelled"


def test_turn_detection_policy_holds_spoken_questions() -> None:
    """create_response off, or speech over an answer that interrupt_response protects: the
    spoken question waits as an input under its speech item id; its words replace its audio
    and the next question (v1 video.query or response.create) takes them."""
    from handlers.core.microphone import SpokenQuestion
    from handlers.wire.protocol import VideoQuery
    from handlers.core.turn_detection import SpeechStarted

    core = _core(turn_detection={"type": "server_vad", "create_response": False})
    assert not core.answers_speech(answering=False) and core.speech_interrupts
    core.update({"turn_detection": {"type": "server_vad", "interrupt_response": False}})
    assert core.answers_speech(answering=False) and not core.answers_speech(answering=True)
    assert not core.speech_interrupts
    core.update({"turn_detection": {"type": "server_vad"}})
    assert core.answers_speech(answering=True) and core.speech_interrupts
    _feed(core, 1, "f1")
    core.speech_item = "item_speech_1"
    started = core.turn_event(SpeechStarted(0))
    assert started.item_id == "item_speech_1" and "item_id" not in json.loads(V1Codec().encode(started)[0])
    held = core.hold_spoken_question(SpokenQuestion(0.0, 500.0, bytes(320), "item_speech_1"))
    assert core.inputs == [held]
    event = core.transcribed_input("item_speech_1", " what is it ")
    assert event is not None and event.item_id == "item_speech_1" and event.audio_ms == 10.0
    assert core.inputs[0].text == "what is it" and core.inputs[0].pcm16 == b""
    plan = core.plan_query(VideoQuery(type="video.query", text="and the colour?"))
    assert plan.question == "what is it\nand the colour?" and plan.audio is None and core.inputs == []
    assert core.transcribed_input("item_speech_1", "late") is None  # taken by the answer already
    with pytest.raises(SessionError) as exc:
        core.hold_spoken_question(SpokenQuestion(0.0, 500.0, bytes(2000), "item_speech_2"))
    assert exc.value.code is ErrorCode.AUDIO_OVERFLOW
