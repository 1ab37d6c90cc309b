"""The conversation's items in the core (create anywhere, delete, retrieve, truncate, answers out
of band) and their Realtime translation (semantic VAD, part-by-part session.update, OpenAI's
error codes, metadata), without socket or engine."""

from __future__ import annotations

import json

import pytest

from handlers.core.events import ErrorReported
from handlers.core.frames import content_key
from handlers.core.session_core import SessionCore, VoicePaths
from handlers.core.timeline import Message, heard_text
from handlers.media.similarity import thumbnail
from handlers.realtime import RealtimeCodec
from handlers.realtime.errors import openai_code
from handlers.wire.commands import (
    AnswerRequest,
    DeleteItem,
    InputMessage,
    RetrieveItem,
    TruncateItem,
    UserInput,
)
from handlers.wire.codec import V1Codec
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.protocol import SessionConfig, VideoFrame
from server.engines.base import Capabilities, Finished, TextDelta, TextSegment, Usage
from handlers.core.answer import Outcome
from server.speech.wav import encode_wav
from tests.core.items_world import LIMITS
from tests.core.items_world import feed_frame as _feed
from tests.protocol_client import b64, jpeg_frame
from tests.core.run_core import Speech, answered, run_answer



def _core() -> SessionCore:
    voice = VoicePaths(output="espeak", input="pocketsphinx", vad_window=512, default_voice="en-us")
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m", max_image_side=640), voice)
    core.configure(SessionConfig())
    return core


def _texts(core: SessionCore, question: str | None = None) -> list[tuple[str, str]]:
    """The prompt as (role, its text) pairs, system prompt left out."""
    prompt = core._render(question)
    return [
        (turn.role, "".join(s.text for s in turn.segments if isinstance(s, TextSegment)).strip())
        for turn in prompt.turns[1:]
    ]


def _answer(core: SessionCore, text: str, request: AnswerRequest | None = None, wavs: list[tuple[int, str]] = ()):
    plan = core.plan_answer(request or AnswerRequest())
    speech = [Speech(encode_wav(bytes(48 * ms), 24_000), words) for ms, words in wavs]
    run_answer(core, plan, [TextDelta(text), *speech, Finished("stop", Usage())])
    return plan


def test_a_seeded_history_enters_the_timeline_as_user_and_assistant_turns() -> None:
    """User items at the end wait; an assistant item closes the open turn with them as its
    question; the next question is asked after that history, each message as what it is."""
    core = _core()
    _feed(core, 1, "f1")
    added = core.apply(UserInput(item_id="u1", text="Say no."))[0]
    assert added.previous_item_id == "f1" and added.at_end
    core.apply(UserInput(item_id="a1", role="assistant", text="No."))
    core.apply(UserInput(item_id="u2", text="What is it?"))
    plan = core.plan_answer(AnswerRequest())
    core.query_prompt(plan)
    assert plan.question == "What is it?"
    assert _texts(core, plan.question) == [("user", "[0.0s]\nSay no."), ("assistant", "No."), ("user", "What is it?")]


def test_items_go_where_previous_item_id_says_or_are_refused() -> None:
    """An item after a message of a closed turn, or at root, is put there; an unknown
    previous item is item_not_found and a used id duplicate_item_id (nothing is added)."""
    core = _core()
    _feed(core, 1, "f1")
    core.apply(UserInput(item_id="q1", text="Colour?"))
    _answer(core, "Grey.")
    answer_id = core.timeline.turns[0].messages[1].item_ids[0]
    put = core.apply(UserInput(item_id="a0", role="assistant", text="Hello.", previous_item_id="root"))[0]
    assert put.previous_item_id is None and not put.at_end
    core.apply(UserInput(item_id="u9", text="Really?", previous_item_id="q1"))
    assert [m.text for m in core.timeline.turns[0].messages] == ["Hello.", "Colour?", "Really?", "Grey."]
    assert core.timeline.edited
    after_answer = core.apply(UserInput(item_id="u10", text="Next?", previous_item_id=answer_id))[0]
    assert after_answer.at_end and [i.item_id for i in core.inputs] == ["u10"]  # the newest item: the end
    for item, code in [
        (UserInput(item_id="x", text="t", previous_item_id="nope"), ErrorCode.ITEM_NOT_FOUND),
        (UserInput(item_id="q1", text="again"), ErrorCode.DUPLICATE_ITEM_ID),
    ]:
        with pytest.raises(SessionError) as exc:
            core.apply(item)
        assert exc.value.code is code
    assert [i.item_id for i in core.inputs] == ["u10"]


def test_answers_are_items_deleted_retrieved_and_truncated_to_the_heard_words() -> None:
    """A spoken answer is retrieved with its transcript and audio length, truncated to the
    words its first ms carried (timeline too), then deleted; a text answer cannot be truncated."""
    core = _core()
    _feed(core, 1, "f1")
    core.apply(UserInput(item_id="q1", text="Describe."))
    plan = _answer(core, "One two. Three four five.", AnswerRequest(modalities=["text", "audio"]),
                   wavs=[(400, "One two."), (600, "Three four five.")])
    got = core.apply(RetrieveItem(item_id=plan.item_id))[0]
    assert got.role == "assistant" and got.text == "One two. Three four five." and got.audio_ms == 1000.0
    core.apply(TruncateItem(item_id=plan.item_id, audio_end_ms=800))
    assert core.apply(RetrieveItem(item_id=plan.item_id))[0].text == "One two. Three four"
    assert core.timeline.turns[0].answer == "One two. Three four"
    core.apply(DeleteItem(item_id=plan.item_id))
    assert core.timeline.turns[0].answer == "" and core.timeline.turns[0].question == "Describe."
    core.apply(UserInput(item_id="q2", text="Again?"))
    text_plan = _answer(core, "Yes.")
    with pytest.raises(SessionError) as exc:
        core.apply(TruncateItem(item_id=text_plan.item_id, audio_end_ms=10))
    assert exc.value.code is ErrorCode.INVALID_TRUNCATE


def test_a_running_answer_truncated_or_deleted_joins_the_timeline_so() -> None:
    """Truncate and delete of the answer under way take effect when it ends: only the heard
    words, or only its question, join the timeline."""
    core = _core()
    _feed(core, 1, "f1")
    plan = core.plan_answer(AnswerRequest(modalities=["text", "audio"]))
    core.ask(plan, 0.0)
    plan.start()
    core.query_prompt(plan)
    plan.output(TextDelta("Red and blue."), 0.1)
    plan.audio_out(encode_wav(bytes(48 * 500), 24_000), 0.2, "Red and blue.")
    retrieved = core.apply(RetrieveItem(item_id=plan.item_id))[0]
    assert (retrieved.text, retrieved.audio_ms) == ("Red and blue.", 500.0)  # the running answer, as said so far
    core.apply(TruncateItem(item_id=plan.item_id, audio_end_ms=200))
    plan.output(Finished("stop", Usage()), 0.3)
    core.end_answer(plan, Outcome.COMPLETED, 0.4)
    assert core.timeline.turns[-1].answer == "Red"
    plan = core.plan_answer(AnswerRequest())
    core.ask(plan, 0.0)
    plan.start()
    core.query_prompt(plan)
    core.apply(DeleteItem(item_id=plan.item_id))
    plan.output(TextDelta("Gone."), 0.1)
    plan.output(Finished("stop", Usage()), 0.2)
    core.end_answer(plan, Outcome.COMPLETED, 0.3)
    assert "Gone." not in [m.text for t in core.timeline.turns for m in t.messages]


def test_heard_text_of_an_engine_voice_is_the_share_of_its_time() -> None:
    """Audio with no words of its own (an engine's voice): the words in proportion to time."""
    message = Message("assistant", "a b c d", ("i",), ((1000.0, ""),))
    assert heard_text(message, 500) == "a b" and heard_text(message, 5000) == "a b c d"


def test_out_of_band_answers_keep_the_conversation_as_it_was() -> None:
    """conversation none: pending inputs stay and the answer joins nothing; input: the
    answer's own context (inline text, a referenced item) over the buffered frames."""
    core = _core()
    _feed(core, 1, "f1")
    core.apply(UserInput(item_id="q1", text="Pending?"))
    _answer(core, "Aside.", AnswerRequest(in_conversation=False))
    assert [i.item_id for i in core.inputs] == ["q1"] and not core.timeline.turns
    plan = core.plan_answer(AnswerRequest(in_conversation=False, input=[
        InputMessage(role="user", text="Only this?"), InputMessage(item_id="q1"),
    ]))
    prompt = answered(core, plan, "Both.").prompt
    words = ["".join(s.text for s in t.segments if isinstance(s, TextSegment)) for t in prompt.turns[1:]]
    assert words[0] == "Only this?" and words[-1].endswith("Pending?") and [f.frame_id for f in plan.used] == ["f1"]
    assert [i.item_id for i in core.inputs] == ["q1"] and not core.timeline.turns
    with pytest.raises(SessionError) as exc:
        core.plan_answer(AnswerRequest(input=[InputMessage(item_id="nope")]))
    assert exc.value.code is ErrorCode.ITEM_NOT_FOUND


def test_one_response_at_a_time_and_low_detail_images() -> None:
    """An exclusive request while answering is conversation_already_has_active_response;
    detail low sends a smaller picture under its own cache key."""
    core = _core()
    core.check_request(AnswerRequest(exclusive=True), answering=False)
    core.check_request(AnswerRequest(), answering=True)  # v1's: it interrupts instead
    with pytest.raises(SessionError) as exc:
        core.check_request(AnswerRequest(exclusive=True), answering=True)
    assert exc.value.code is ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE
    low = VideoFrame(type="video.frame", data="x", detail="low")
    assert core.image_side(low) == 320 and core.image_side(VideoFrame(type="video.frame", data="x")) == 640


def _codec_with_session(codec: RealtimeCodec, core: SessionCore) -> None:
    codec.encode(core.configure(SessionConfig()))


def test_realtime_session_update_is_applied_part_by_part_with_semantic_vad() -> None:
    """semantic_vad becomes server VAD with the silence its eagerness asks for and is echoed as
    semantic_vad; a wrong part is left out and listed, and the rest still applies."""
    codec = RealtimeCodec("m")
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), VoicePaths(output="espeak", vad_window=512))
    _codec_with_session(codec, core)
    [update] = codec.decode(json.dumps({"type": "session.update", "event_id": "e1", "session": {
        "type": "realtime", "instructions": "Hi.", "output_modalities": ["sideways"],
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}},
                  "output": {"speed": 9, "pitch": 2}},
        "tools": [{"type": "function", "name": "f"}],
    }}))
    assert update.changes["turn_detection"] == {"silence_ms": 400} and update.changes["system_prompt"] == "Hi."
    assert [r.split(":")[0] for r in update.refused] == ["session.output_modalities", "session.audio.output.speed"]
    updated, error = core.apply(update)
    session = json.loads(codec.encode(updated)[0])["session"]
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session["audio"]["input"]["turn_detection"]["eagerness"] == "high" and session["instructions"] == "Hi."
    assert core.config.turn_detection.silence_ms == 400 and len(session["livesight"]["refused"]) == 2
    assert session["livesight"]["ignored"] == ["session.audio.output.pitch", "session.tools"]
    sent = json.loads(codec.encode(error.model_copy(update={"origin": Origin("e1", "session.update")}))[0])
    assert sent["error"]["event_id"] == "e1" and sent["error"]["code"] == "invalid_value"


def test_realtime_errors_take_openai_codes_by_the_event_that_caused_them() -> None:
    """item_not_found is item_retrieve/delete/truncate_invalid_item_id by event; OpenAI's own
    codes pass through; codes OpenAI does not have stay livesight's."""
    assert openai_code("item_not_found", "conversation.item.retrieve") == "item_retrieve_invalid_item_id"
    assert openai_code("item_not_found", "conversation.item.truncate") == "item_truncate_invalid_item_id"
    assert openai_code("invalid_audio", "input_audio_buffer.commit") == "input_audio_buffer_commit_empty"
    assert openai_code("duplicate_item_id", "conversation.item.create") == "item_create_duplicate_item_id"
    assert openai_code("response_cancel_not_active", "response.cancel") == "response_cancel_not_active"
    assert openai_code("no_frames", "response.create") == "no_frames"
    codec = RealtimeCodec("m")
    with pytest.raises(SessionError) as exc:
        codec.decode(json.dumps({"type": "conversation.item.truncate", "event_id": "e2", "item_id": "x"}))
    error = ErrorReported(code=exc.value.code.value, message=exc.value.message, origin=exc.value.origin,
                          wire_code=exc.value.wire_code)
    sent = json.loads(codec.encode(error)[0])["error"]
    assert sent["code"] == "missing_required_parameter" and sent["event_id"] == "e2"
    assert "origin" not in V1Codec().encode(error)[0]  # v1's error is unchanged


def test_realtime_response_metadata_is_echoed_and_out_of_band_joins_no_conversation() -> None:
    """response.create metadata comes back on response.created and response.done; with
    conversation none there is no conversation.item.added and no conversation_id."""
    codec = RealtimeCodec("m")
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), VoicePaths())
    _codec_with_session(codec, core)
    _feed(core, 1, "f1")
    [request] = codec.decode(json.dumps({"type": "response.create", "response": {
        "conversation": "none", "metadata": {"client_event_id": "c1"}}}))
    assert request.exclusive and not request.in_conversation
    plan = core.plan_answer(request)
    started = [json.loads(m) for m in codec.encode(plan.start_event())]
    assert [e["type"] for e in started] == ["response.created", "response.output_item.added",
                                            "response.content_part.added"]
    assert started[0]["response"]["metadata"] == {"client_event_id": "c1"}
    assert "conversation_id" not in started[0]["response"]


def test_client_messages_are_bounded_in_the_timeline() -> None:
    """Seeded assistant messages stop at MAX_TIMELINE_CHARS with invalid_message; the session
    goes on, and deleting one makes room again."""
    from handlers.core.items import MAX_INPUT_CHARS, MAX_TIMELINE_CHARS

    core = _core()
    _feed(core, 1, "f1")  # the first turn holds a frame: the turns after it stay live, not folded
    n = 0
    with pytest.raises(SessionError) as exc:
        while n < 100:
            core.apply(UserInput(item_id=f"a{n}", role="assistant", text="x" * MAX_INPUT_CHARS))
            n += 1
    assert exc.value.code is ErrorCode.INVALID_MESSAGE and n == MAX_TIMELINE_CHARS // MAX_INPUT_CHARS
    core.apply(DeleteItem(item_id="a0"))
    core.apply(UserInput(item_id="again", role="assistant", text="x" * MAX_INPUT_CHARS))


def test_previous_item_ids_follow_the_core_conversation() -> None:
    """Each item, frame and answer names the item before it as the core holds them: deleting
    the newest makes the one before it the newest again."""
    core = _core()
    _feed(core, 1, "f1")
    core.apply(UserInput(item_id="q1", text="One?"))
    core.apply(DeleteItem(item_id="q1"))
    assert core.apply(UserInput(item_id="q2", text="Two?"))[0].previous_item_id == "f1"
    plan = core.plan_answer(AnswerRequest())
    core.ask(plan, 0.0)
    start = plan.start()[0]
    assert start.previous_item_id == "q2" and start.item_id == plan.item_id
    core.end_answer(plan, Outcome.FAILED, 0.1, "engine_error")
    data = jpeg_frame(7)
    ack = core.accept_frame(VideoFrame(type="video.frame", data=b64(data), frame_id="f2"), data, content_key(data),
                            thumbnail(data), 2000.0).ack
    assert ack is not None and ack.previous_item_id == plan.item_id
    assert "previous_item_id" not in V1Codec().encode(ack)[0]  # not on the v1 wire


def test_a_commit_under_turn_detection_is_an_empty_commit() -> None:
    """With server turn detection the server commits each spoken turn: a client's commit finds
    nothing to commit (input_audio_buffer_commit_empty on /v1/realtime, which clients that
    commit anyway, as LiveKit does, take as harmless)."""
    from handlers.wire.commands import CommitAudio

    core = _core()
    core.update({"turn_detection": {"type": "server_vad"}})
    with pytest.raises(SessionError) as exc:
        core.apply(CommitAudio(item_id="c1"))
    assert exc.value.code is ErrorCode.INVALID_AUDIO
    assert openai_code(exc.value.code, "input_audio_buffer.commit") == "input_audio_buffer_commit_empty"


def test_realtime_events_out_of_the_cores_bounds_are_refused_not_raised() -> None:
    """An item whose parts add up past the core's text bound, or a previous_item_id too long,
    is an invalid_message error naming the event (the session goes on), not an exception."""
    codec = RealtimeCodec("m")
    long_reply = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y" * 15000}] * 3}
    for message in [
        {"type": "conversation.item.create", "event_id": "e5", "item": long_reply},
        {"type": "conversation.item.create", "event_id": "e5", "previous_item_id": "x" * 300,
         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    ]:
        with pytest.raises(SessionError) as exc:
            codec.decode(json.dumps(message))
        assert exc.value.code is ErrorCode.INVALID_MESSAGE and exc.value.origin == Origin("e5", "conversation.item.create")
