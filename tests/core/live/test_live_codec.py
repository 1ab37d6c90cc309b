"""The Live codec alone (no socket, no engine): how Live messages become the core's events and
the core's events Live messages, as the google-genai SDK sends and reads them."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.core.events import (
    AnswerEnded,
    AnswerStarted,
    AnswerTextDelta,
    ErrorReported,
    SessionClosing,
    SessionReady,
    Timings,
    Usage,
)
from handlers.live.codec import LiveCodec, standard_base64
from handlers.live.messages import parse_client_message
from handlers.realtime import RealtimeCodec
from handlers.wire.codec import CloseConnection, V1Codec
from handlers.wire.commands import AnswerRequest, ClearAudio, UserInput
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.strict_json import MAX_DEPTH
from handlers.wire.protocol import AudioChunkIn, ResponseCancel, SessionConfig, VideoFrame, VideoQuery

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 3  # base64 of it has '+' and '/' (and '-', '_' URL-safe)


def setup(codec: LiveCodec, **setup: object) -> SessionConfig:
    [config] = codec.decode(json.dumps({"setup": {"model": "models/x", **setup}}))
    assert isinstance(config, SessionConfig)
    return config


def ready(codec: LiveCodec, token: str | None = "tok") -> list[dict]:
    event = SessionReady(session_id="s" * 32, config={}, limits={}, capabilities={}, resume_token=token)
    return [json.loads(m) for m in codec.encode(event)]


def test_setup_maps_to_session_config_in_either_casing() -> None:
    """camelCase, snake_case and a mix read the same: modalities, sampling, voice, system
    prompt, activity detection and resumption."""
    camel = {"generationConfig": {"responseModalities": ["AUDIO"], "maxOutputTokens": 50, "temperature": 0.5,
                                  "topP": 0.9, "seed": 3,
                                  "speechConfig": {"voice_config": {"prebuilt_voice_config": {"voice_name": "Puck"}}}},
             "systemInstruction": {"parts": [{"text": "be brief"}]},
             "realtimeInputConfig": {
                 "automaticActivityDetection": {"startOfSpeechSensitivity": "START_SENSITIVITY_HIGH",
                                                "silenceDurationMs": 400, "prefixPaddingMs": 100},
                 "activityHandling": "NO_INTERRUPTION"},
             "sessionResumption": {"handle": "abc"}}
    snake = json.loads(
        json.dumps(camel).replace("generationConfig", "generation_config")
        .replace("maxOutputTokens", "max_output_tokens").replace("silenceDurationMs", "silence_duration_ms")
    )
    for given in (camel, snake):
        config = setup(LiveCodec(), **given)
        assert config.modalities == ["text", "audio"] and config.voice == "Puck"
        sampling = config.sampling
        assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (50, 0.5, 0.9, 3)
        assert config.system_prompt == "be brief" and config.resume_token == "abc"
        vad = config.turn_detection
        assert (vad.threshold, vad.silence_ms, vad.prefix_padding_ms, vad.interrupt_response) == (0.3, 400, 100, False)
    text = setup(LiveCodec(), generationConfig={"responseModalities": ["TEXT"]},
                 realtimeInputConfig={"automaticActivityDetection": {"disabled": True}})
    assert text.modalities == ["text"] and text.turn_detection is None


@pytest.mark.parametrize(
    "bad",
    [
        {"setup": {"tools": [{"functionDeclarations": [{"name": "f"}]}]}},
        {"setup": {"generationConfig": {"temperature": "0.5"}}},
        {"setup": {"generationConfig": {"responseModalities": ["IMAGE"]}}},
        {"setup": {"unknownField": 1}},
        {"setup": {"livesight": {"watches": [{"condition": "a door?"}]}}},  # no proactivity
        {"realtimeInput": {"text": "hi"}},  # before setup
        {"setup": {}, "realtime_input": {"text": "hi"}},  # two messages in one
        {"setup": {"generationConfig": {}, "generation_config": {}}},  # one field under both names
    ],
)
def test_a_bad_first_message_is_invalid_config(bad: dict) -> None:
    """Anything but a valid setup first: invalid_config (a close with 1007)."""
    with pytest.raises(SessionError) as refused:
        LiveCodec().decode(json.dumps(bad))
    assert refused.value.code is ErrorCode.INVALID_CONFIG


def test_both_base64_alphabets_with_or_without_padding() -> None:
    """URL-safe (the SDK's) and standard base64, padded or not, reach the core as standard."""
    standard = base64.b64encode(JPEG).decode()
    urlsafe = base64.urlsafe_b64encode(JPEG).decode().rstrip("=")
    assert "-" in urlsafe or "_" in urlsafe
    assert standard_base64(urlsafe) == standard == standard_base64(standard)
    codec = LiveCodec()
    setup(codec)
    for data in (standard, urlsafe):
        [event] = codec.decode(json.dumps({"realtime_input": {"video": {"data": data, "mime_type": "image/jpeg"}}}))
        assert isinstance(event, VideoFrame) and base64.b64decode(event.data) == JPEG


def test_realtime_input_and_client_content_map_to_core_events() -> None:
    """audio (resampled to 16 kHz), text, clientContent with and without turnComplete,
    activityStart/End with activity detection off."""
    codec = LiveCodec()
    setup(codec, realtimeInputConfig={"automaticActivityDetection": {"disabled": True}})
    pcm24 = b"\x01\x00" * 2400  # 100 ms at 24 kHz
    [audio] = codec.decode(json.dumps({"realtimeInput": {"audio": {
        "data": base64.b64encode(pcm24).decode(), "mimeType": "audio/pcm;rate=24000"}}}))
    assert isinstance(audio, AudioChunkIn) and len(base64.b64decode(audio.data)) == 1600 * 2
    [query] = codec.decode(json.dumps({"realtimeInput": {"text": "what now?"}}))
    assert isinstance(query, VideoQuery) and query.text == "what now?"
    [nudge] = codec.decode(json.dumps({"realtimeInput": {"text": " "}}))
    assert isinstance(nudge, AnswerRequest) and nudge.exclusive
    [held] = codec.decode(json.dumps({"clientContent": {"turns": [{"role": "user", "parts": [{"text": "first"}]}]}}))
    assert isinstance(held, UserInput) and held.text == "first"
    frame, asked = codec.decode(json.dumps({"client_content": {"turns": [{"parts": [
        {"inlineData": {"data": base64.b64encode(JPEG).decode(), "mimeType": "image/jpeg"}}, {"text": "and this?"}]}],
        "turnComplete": True}}))
    assert isinstance(frame, VideoFrame) and isinstance(asked, VideoQuery) and asked.text == "and this?"
    user, model, last = codec.decode(json.dumps({"clientContent": {"turns": [
        {"role": "user", "parts": [{"text": "I am Ann."}]}, {"role": "model", "parts": [{"text": "Hello Ann."}]},
        {"role": "user", "parts": [{"text": "Who am I?"}]}], "turnComplete": True}}))
    assert (user.role, user.text, model.role, model.text) == ("user", "I am Ann.", "assistant", "Hello Ann.")
    assert isinstance(last, VideoQuery) and last.text == "Who am I?"
    cancel, clear = codec.decode(json.dumps({"realtimeInput": {"activityStart": {}}}))
    assert isinstance(cancel, ResponseCancel) and isinstance(clear, ClearAudio)
    [end] = codec.decode(json.dumps({"realtimeInput": {"activityEnd": {}}}))
    assert isinstance(end, VideoQuery) and end.text == ""
    assert codec.decode(json.dumps({"realtimeInput": {"audioStreamEnd": True}})) == []  # activity detection off


@pytest.mark.parametrize(
    "message, code",
    [
        ({"toolResponse": {"functionResponses": []}}, ErrorCode.UNKNOWN_TYPE),
        ({"setup": {}}, ErrorCode.INVALID_MESSAGE),  # a second setup
        ({"realtimeInput": {"activityStart": {}}}, ErrorCode.INVALID_MESSAGE),  # activity detection is on
        ({"realtimeInput": {"text": "a", "audioStreamEnd": True}}, ErrorCode.INVALID_MESSAGE),
        ({"clientContent": {"turns": [{"role": "tool", "parts": [{"text": "x"}]}]}}, ErrorCode.INVALID_MESSAGE),
        ({"clientContent": {"turns": [{"role": "model", "parts": [{"inlineData": {"data": "AAAA"}}]}]}},
         ErrorCode.INVALID_MESSAGE),
        ({"realtimeInput": {"audio": {"data": "AAAA", "mimeType": "audio/pcm;rate=16000"}}}, ErrorCode.INVALID_AUDIO),
        ({"realtimeInput": {"audio": {"data": "@@@@", "mimeType": "audio/pcm"}}}, ErrorCode.INVALID_AUDIO),
        ({"realtimeInput": {"audio": {"data": "AAAA", "mimeType": "audio/pcm;rate=99"}}}, ErrorCode.INVALID_AUDIO),
        ({"realtimeInput": {"audio": {"data": "AAAA", "mimeType": "audio/wav"}}}, ErrorCode.INVALID_AUDIO),
        ({"realtimeInput": {"video": {"data": "AAAA", "mimeType": "video/mp4"}}}, ErrorCode.INVALID_IMAGE),
        ({"realtimeInput": {"text": "\ud800"}}, ErrorCode.INVALID_MESSAGE),
        ({"bogus": 1}, ErrorCode.INVALID_MESSAGE),
    ],
)
def test_bad_messages_after_setup(message: dict, code: ErrorCode) -> None:
    """Each bad message raises the code the docs give it (closes or skips, per CLOSES)."""
    codec = LiveCodec()
    setup(codec)
    with pytest.raises(SessionError) as refused:
        codec.decode(json.dumps(message))
    assert refused.value.code is code


def test_not_json_is_invalid_json() -> None:
    """NaN and broken JSON are not JSON."""
    for raw in ("{", '{"setup": NaN}', b"\xff"):
        with pytest.raises(SessionError) as refused:
            parse_client_message(raw)
        assert refused.value.code is ErrorCode.INVALID_JSON


def _done(status: str, **fields: object) -> AnswerEnded:
    usage = Usage(prompt_tokens=120, cached_tokens=100, completion_tokens=5, image_tokens=100, text_tokens=20)
    return AnswerEnded(request_id="r", status=status, usage=usage, timings=Timings(total_ms=1.0), **fields)


def test_server_events_become_live_messages() -> None:
    """setupComplete then sessionResumptionUpdate; text parts; generationComplete then
    turnComplete with usageMetadata; interrupted; goAway; a closing error; an empty turn for
    a question with no frame."""
    codec = LiveCodec()
    setup(codec, generationConfig={"responseModalities": ["TEXT"]}, sessionResumption={})
    first, update = ready(codec)
    assert first == {"setupComplete": {"sessionId": "s" * 32}}
    assert update == {"sessionResumptionUpdate": {"newHandle": "tok", "resumable": True}}
    assert codec.encode(AnswerStarted(request_id="r", modalities=["text"])) == []
    [delta] = [json.loads(m) for m in codec.encode(AnswerTextDelta(request_id="r", delta="hi"))]
    assert delta == {"serverContent": {"modelTurn": {"role": "model", "parts": [{"text": "hi"}]}}}
    generation, turn = [json.loads(m) for m in codec.encode(_done("completed"))]
    assert generation == {"serverContent": {"generationComplete": True}}
    assert turn["serverContent"] == {"turnComplete": True}
    assert turn["usageMetadata"] == {
        "promptTokenCount": 120, "cachedContentTokenCount": 100, "responseTokenCount": 5, "totalTokenCount": 125,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 20}, {"modality": "IMAGE", "tokenCount": 100}],
        "responseTokensDetails": [{"modality": "TEXT", "tokenCount": 5}],
    }
    [cut] = [json.loads(m) for m in codec.encode(_done("interrupted", interrupted_by="speech"))]
    assert cut["serverContent"] == {"interrupted": True}
    assert codec.encode(_done("interrupted", interrupted_by="session_end")) == []
    [away] = [json.loads(m) for m in codec.encode(SessionClosing(deadline_ms=12_500))]
    assert away == {"goAway": {"timeLeft": "12.5s"}}
    [empty] = [json.loads(m) for m in codec.encode(ErrorReported(code="no_frames", message="no frame"))]
    assert empty["serverContent"] == {"turnComplete": True} and empty["usageMetadata"]["totalTokenCount"] == 0
    assert codec.encode(ErrorReported(code="invalid_image", message="bad")) == []  # skipped
    with pytest.raises(CloseConnection) as closed:
        codec.encode(ErrorReported(code="invalid_message", message="x" * 500))
    assert closed.value.code == 1007 and len(closed.value.reason.encode()) <= 123


def test_the_doc_names_every_field_both_ways() -> None:
    """docs/gemini-live.md names every field the codec reads or writes (as `camelCase`)."""
    import re
    from pathlib import Path

    from pydantic.alias_generators import to_camel

    from handlers.live import messages as live

    text = (Path(__file__).resolve().parents[3] / "docs" / "gemini-live.md").read_text()
    models = [live.Setup, live.GenerationConfig, live.RealtimeInputConfig, live.AutomaticActivityDetection,
              live.SessionResumptionConfig, live.RealtimeInput, live.ClientContent, live.ClientMessage,
              live.ServerMessage, live.ServerContent, live.UsageMetadata, live.SessionResumptionUpdate, live.GoAway]
    missing = [f"{m.__name__}.{name}" for m in models for name in m.model_fields
               if not re.search(rf"`[^`]*\b{to_camel(name)}\b[^`]*`", text)]
    assert not missing, missing


@pytest.mark.parametrize(
    "code, message, close_code, reason",
    [
        ("config_timeout", "no session.config within 10 s", 1008, "no setup within 10 s"),
        ("resume_failed", "the resume token is unknown or expired; this is a new session", 1008, "sessionResumption"),
        ("unauthorized", "a valid API key is required", 1008, "API key"),
        ("too_many_sessions", "the server is at its limit", 1013, "limit"),
        ("server_closing", "the server is shutting down", 1012, "shutting down"),
        ("engine_error", "the engine failed to answer", 1011, "engine"),
        ("idle_timeout", "nothing received for 60 s", 1000, "60 s"),
    ],
)
def test_closing_errors_say_why_in_the_close(code: str, message: str, close_code: int, reason: str) -> None:
    """An error the protocol can only answer by closing: its close code, and a reason in Live's words."""
    with pytest.raises(CloseConnection) as closed:
        LiveCodec().encode(ErrorReported(code=code, message=message, closes_session=True))
    assert closed.value.code == close_code and reason in closed.value.reason
    assert "session.config" not in closed.value.reason and "new session" not in closed.value.reason


def test_audio_stream_end_is_the_silence_that_ends_speech() -> None:
    """With activity detection, audioStreamEnd is silence a little past the session's
    silence_ms (speech under way ends and is answered); without it, nothing."""
    codec = LiveCodec()
    setup(codec, realtimeInputConfig={"automaticActivityDetection": {"silenceDurationMs": 400}})
    codec.encode(SessionReady(session_id="s" * 32, config={"turn_detection": {"silence_ms": 400}}, limits={},
                              capabilities={}))
    [silence] = codec.decode(json.dumps({"realtimeInput": {"audioStreamEnd": True}}))
    pcm = base64.b64decode(silence.data)
    assert isinstance(silence, AudioChunkIn) and not any(pcm) and len(pcm) == 16_000 * 2 * 500 // 1000


# --------------------------------------------------------------------------- one JSON front end


def _v1(value: str) -> str:
    return '{"type": "video.query", "text": ' + value + "}"


def _realtime(value: str) -> str:
    return ('{"type": "conversation.item.create", "event_id": "e1", "item": {"type": "message", "role": "user",'
            ' "content": [{"type": "input_text", "text": ' + value + "}]}}")


def _live(value: str) -> str:
    return '{"realtimeInput": {"text": ' + value + "}}"


def _refusals(wrap_value: str) -> dict[str, SessionError]:
    """What v1, Realtime and Live (after setup) each raise for the same hostile value."""
    live_codec = LiveCodec()
    setup(live_codec)
    decoders = {"v1": (V1Codec().decode, _v1), "realtime": (RealtimeCodec("m").decode, _realtime),
                "live": (live_codec.decode, _live)}
    refused = {}
    for name, (decode, wrap) in decoders.items():
        with pytest.raises(SessionError) as err:
            decode(wrap(wrap_value))
        refused[name] = err.value
    return refused


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("NaN", ErrorCode.INVALID_JSON),
        ("Infinity", ErrorCode.INVALID_JSON),
        ("-Infinity", ErrorCode.INVALID_JSON),
        ('"\\ud800"', ErrorCode.INVALID_MESSAGE),
        ('"a\\udfffb"', ErrorCode.INVALID_MESSAGE),
        ('{"\\ud83d": 1}', ErrorCode.INVALID_MESSAGE),  # half of a pair, in a key
        ("[" * 40 + "]" * 40, ErrorCode.INVALID_MESSAGE),
        ("[" * 100_000, ErrorCode.INVALID_MESSAGE),  # past the interpreter's own limit: the same answer
    ],
)
def test_every_codec_refuses_the_same_json_with_v1s_code(value: str, code: ErrorCode) -> None:
    """NaN/Infinity, a lone surrogate and nesting past the limit get the same code on v1,
    Realtime and Live, with the same message; each says it in its own envelope (Realtime: an
    error event with OpenAI's code and no event id, since the message was not read; Live: a
    close 1007)."""
    refused = _refusals(value)
    assert {name: err.code for name, err in refused.items()} == dict.fromkeys(refused, code)
    assert len({err.message for err in refused.values()}) == 1
    realtime, live_codec = RealtimeCodec("m"), LiveCodec()
    error = ErrorReported(code=code, message=refused["realtime"].message, origin=refused["realtime"].origin)
    [out] = [json.loads(m) for m in realtime.encode(error)]
    assert out["error"]["code"] == ("invalid_json" if code is ErrorCode.INVALID_JSON else "invalid_value")
    assert out["error"]["type"] == "invalid_request_error" and "event_id" not in out["error"]
    with pytest.raises(CloseConnection) as closed:
        live_codec.encode(ErrorReported(code=code, message=refused["live"].message))
    assert closed.value.code == 1007


def test_the_nesting_limit_is_the_same_everywhere() -> None:
    """A message nested MAX_DEPTH levels deep is read by every codec; one level more is refused."""
    def nested(levels: int) -> str:  # the value of the question's text: refused by its type, not its depth
        return "[" * levels + "]" * levels

    # v1 and Live put the value 1 and 2 levels in, Realtime 4: the limit counts the whole message.
    for wrap, decode, outer in ((_v1, V1Codec().decode, 1), (_realtime, RealtimeCodec("m").decode, 4)):
        for levels, deep in ((MAX_DEPTH - outer, False), (MAX_DEPTH - outer + 1, True)):
            with pytest.raises(SessionError) as err:
                decode(wrap(nested(levels)))
            assert ("nested more than" in err.value.message) is deep, (wrap, levels)
    codec = LiveCodec()
    setup(codec)
    for levels, deep in ((MAX_DEPTH - 2, False), (MAX_DEPTH - 1, True)):
        with pytest.raises(SessionError) as err:
            codec.decode(_live(nested(levels)))
        assert ("nested more than" in err.value.message) is deep, levels


def test_a_message_over_the_size_limit_is_refused_alike_as_text_or_bytes() -> None:
    """max_message_bytes counts UTF-8 bytes: a message over it is an invalid message on every
    codec; Live reads the same message sent as binary, and refuses it over the limit too."""
    text = '{"realtimeInput": {"text": "' + "\u00e9" * 600 + '"}}'  # 600 characters, 1,200 bytes
    for decode in (V1Codec(1024).decode, RealtimeCodec("m", 1024).decode):
        with pytest.raises(SessionError) as err:
            decode(text)
        assert err.value.code is ErrorCode.INVALID_MESSAGE and "1024 bytes" in err.value.message
    for raw in (text, text.encode()):
        codec = LiveCodec(1024)
        setup(codec)
        with pytest.raises(SessionError) as err:
            codec.decode(raw)
        assert err.value.code is ErrorCode.INVALID_MESSAGE and "1024 bytes" in err.value.message
    codec = LiveCodec(2048)
    setup(codec)
    assert codec.decode(text.encode()) == codec.decode(text) == [VideoQuery(type="video.query", text="\u00e9" * 600)]


_MARK = "\x00poison\x00"
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.just(_MARK),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
).filter(lambda value: json.dumps(_MARK) in json.dumps(value))
_POISON = {"NaN": ErrorCode.INVALID_JSON, "-Infinity": ErrorCode.INVALID_JSON, '"\\udc00"': ErrorCode.INVALID_MESSAGE,
           "[" * MAX_DEPTH + "]" * MAX_DEPTH: ErrorCode.INVALID_MESSAGE}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(value=_JSON, poison=st.sampled_from(sorted(_POISON)))
def test_hostile_json_anywhere_gets_the_same_code_on_every_codec(value: object, poison: str) -> None:
    """Generated JSON with NaN, a lone surrogate or too deep a nesting somewhere in it gets the
    poison's code on v1, Realtime and Live alike."""
    hostile = json.dumps(value).replace(json.dumps(_MARK), poison)
    refused = _refusals(hostile)
    assert {err.code for err in refused.values()} == {_POISON[poison]}, hostile


def test_the_livesight_fields_are_one_list() -> None:
    """Realtime's session.livesight and Live's setup.livesight take the same session.config
    fields (LIVESIGHT_FIELDS), Live also speech_rate (Realtime has audio.output.speed)."""
    from handlers.realtime.client_events import LivesightSettings
    from handlers.wire.fields import LIVE_ONLY_FIELDS, LIVESIGHT_FIELDS

    assert tuple(LivesightSettings.model_fields) == LIVESIGHT_FIELDS
    config = setup(LiveCodec(), livesight={"max_frames": 7, "speech_rate": 1.5})
    assert (config.max_frames, config.speech_rate) == (7, 1.5) and LIVE_ONLY_FIELDS == ("speech_rate",)
    with pytest.raises(SessionError) as refused:
        setup(LiveCodec(), livesight={"system_prompt": "x"})
    assert refused.value.code is ErrorCode.INVALID_CONFIG
