"""The Gemini Live protocol (``BidiGenerateContent``) as typed messages, and its one parser.

Client -> server (each message is a JSON object with exactly one of these keys):

    setup           the first message: model, generationConfig, systemInstruction,
                    realtimeInputConfig, input/outputAudioTranscription, sessionResumption,
                    contextWindowCompression, proactivity (and livesight's own ``livesight``)
    realtimeInput   one of video, audio, text, activityStart, activityEnd, audioStreamEnd
                    (or the older mediaChunks)
    clientContent   turns (text and inline images) and turnComplete
    toolResponse    refused: this server makes no tool calls

Server -> client (each message a ``LiveServerMessage``): setupComplete, serverContent
(modelTurn parts: text, or inlineData audio/pcm;rate=24000; generationComplete,
turnComplete, interrupted, inputTranscription, outputTranscription), usageMetadata,
goAway, sessionResumptionUpdate.

A message is read through the JSON front end every protocol shares
(``handlers/wire/strict_json.py``: no ``NaN``, no lone surrogate, bounded nesting, each with
v1's code). Keys are read as proto3 JSON reads them: lowerCamelCase or the proto's
snake_case, in any mix (the google-genai SDK sends ``realtime_input`` beside ``mimeType``);
a message that gives one field under both names is refused. Media base64 may use either
alphabet (standard or URL-safe), with or without padding. Types are strict: a string where
a number belongs is refused, nothing is coerced.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from handlers.wire.client_events import describe_validation_error
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.fields import MAX_QUESTION_CHARS, MAX_SEED
from handlers.wire.strict_json import read_json_object


class _In(BaseModel):
    """A client object: known fields only, strict types, snake_case names."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class _Lenient(_In):
    """A config object whose fields not listed here are accepted and ignored (documented)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)


class Blob(_In):
    mime_type: str | None = Field(None, max_length=200)
    data: str


class Part(_In):
    text: str | None = None
    inline_data: Blob | None = None


class Content(_In):
    role: str | None = Field(None, max_length=64)
    parts: list[Part] = Field(default_factory=list, max_length=256)


class PrebuiltVoiceConfig(_In):
    voice_name: str | None = Field(None, max_length=200)


class VoiceConfig(_In):
    prebuilt_voice_config: PrebuiltVoiceConfig | None = None


class SpeechConfig(_In):
    voice_config: VoiceConfig | None = None
    language_code: str | None = Field(None, max_length=32)  # ignored: the voice names the language


class GenerationConfig(_In):
    """What an answer is; ``top_k`` and the fields after it are taken and ignored (they change
    nothing an answer means here: see docs/gemini-live.md)."""

    response_modalities: list[Literal["TEXT", "AUDIO"]] | None = Field(None, min_length=1, max_length=2)
    speech_config: SpeechConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    top_k: int | None = Field(None, ge=0)
    candidate_count: Literal[1] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    media_resolution: (
        Literal[
            "MEDIA_RESOLUTION_UNSPECIFIED", "MEDIA_RESOLUTION_LOW", "MEDIA_RESOLUTION_MEDIUM", "MEDIA_RESOLUTION_HIGH"
        ]
        | None
    ) = None
    enable_affective_dialog: bool | None = None
    thinking_config: dict[str, Any] | None = None
    translation_config: dict[str, Any] | None = None
    response_mime_type: Literal["text/plain"] | None = None


class AutomaticActivityDetection(_In):
    disabled: bool | None = None
    start_of_speech_sensitivity: (
        Literal["START_SENSITIVITY_UNSPECIFIED", "START_SENSITIVITY_HIGH", "START_SENSITIVITY_LOW"] | None
    ) = None
    end_of_speech_sensitivity: (
        Literal["END_SENSITIVITY_UNSPECIFIED", "END_SENSITIVITY_HIGH", "END_SENSITIVITY_LOW"] | None
    ) = None
    prefix_padding_ms: int | None = Field(None, ge=0)
    silence_duration_ms: int | None = Field(None, ge=0)


class RealtimeInputConfig(_In):
    automatic_activity_detection: AutomaticActivityDetection | None = None
    activity_handling: (
        Literal["ACTIVITY_HANDLING_UNSPECIFIED", "START_OF_ACTIVITY_INTERRUPTS", "NO_INTERRUPTION"] | None
    ) = None
    turn_coverage: (
        Literal["TURN_COVERAGE_UNSPECIFIED", "TURN_INCLUDES_ONLY_ACTIVITY", "TURN_INCLUDES_ALL_INPUT"] | None
    ) = None


class AudioTranscriptionConfig(_Lenient):
    """Its fields (language codes, vocabulary) are accepted and ignored."""


class SessionResumptionConfig(_In):
    handle: str | None = Field(None, max_length=200)
    transparent: bool | None = None


class SlidingWindow(_In):
    target_tokens: int | None = Field(None, ge=0)


class ContextWindowCompression(_In):
    trigger_tokens: int | None = Field(None, ge=0)
    sliding_window: SlidingWindow | None = None


class ProactivityConfig(_In):
    proactive_audio: bool | None = None


class Setup(_In):
    model: str | None = Field(None, max_length=512)
    generation_config: GenerationConfig | None = None
    system_instruction: Content | str | None = None
    tools: list[dict[str, Any]] | None = None
    realtime_input_config: RealtimeInputConfig | None = None
    input_audio_transcription: AudioTranscriptionConfig | None = None
    output_audio_transcription: AudioTranscriptionConfig | None = None
    session_resumption: SessionResumptionConfig | None = None
    context_window_compression: ContextWindowCompression | None = None
    proactivity: ProactivityConfig | None = None
    explicit_vad_signal: bool | None = None  # ignored: no voiceActivityDetectionSignal is sent
    history_config: dict[str, Any] | None = None  # ignored: clientContent turns join the conversation anyway
    safety_settings: list[dict[str, Any]] | None = None  # ignored
    labels: dict[str, str] | None = None  # ignored
    #: livesight's own settings (``session.config`` fields: frames, filter, watches, ...).
    livesight: dict[str, Any] | None = None


class RealtimeInput(_In):
    media_chunks: list[Blob] | None = Field(None, max_length=64)
    audio: Blob | None = None
    video: Blob | None = None
    text: str | None = Field(None, max_length=MAX_QUESTION_CHARS)
    activity_start: dict[str, Any] | None = None
    activity_end: dict[str, Any] | None = None
    audio_stream_end: bool | None = None


class ClientContent(_In):
    turns: list[Content] | None = Field(None, max_length=64)
    turn_complete: bool | None = None


class ToolResponse(_Lenient):
    """Refused as a whole: this server makes no tool calls."""


class ClientMessage(_In):
    setup: Setup | None = None
    client_content: ClientContent | None = None
    realtime_input: RealtimeInput | None = None
    tool_response: ToolResponse | None = None

    def kind(self) -> str:
        """The one message this is (``setup``, ``client_content``, ...)."""
        return next(name for name in type(self).model_fields if getattr(self, name) is not None)


_CAPS = re.compile(r"(?<!^)(?=[A-Z])")


def snake(key: str) -> str:
    """A proto3 JSON key as the proto's field name: ``mimeType`` -> ``mime_type``."""
    return _CAPS.sub("_", key).lower() if key != key.lower() else key


def _normalised(value: Any) -> Any:
    """``value`` with every key in snake_case (``read_json_object`` bounded its depth).
    Raises ``ValueError`` for a key given twice (under both names)."""
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = snake(key)
            if name in out:
                raise ValueError(f"field {name!r} is given twice (camelCase and snake_case)")
            out[name] = _normalised(item)
        return out
    return value


def parse_client_message(raw: str | bytes, *, max_bytes: int | None = None) -> ClientMessage:
    """Parse one client message. The SDK sends text; a binary message holding UTF-8 JSON is
    read as text too (proto3 JSON has no binary form). ``max_bytes``: the largest message.

    Raises ``SessionError``: ``invalid_json`` (not JSON, ``NaN``), ``invalid_message`` (not an
    object, nested too deeply, a lone surrogate: the JSON front end every protocol shares; not
    exactly one known message, a field of the wrong type or out of range, a key given twice).
    """
    obj = read_json_object(raw, binary=True, max_bytes=max_bytes)
    try:
        obj = _normalised(obj)
    except ValueError as exc:
        raise SessionError(ErrorCode.INVALID_MESSAGE, str(exc)) from None
    present = [k for k, v in obj.items() if v is not None]
    if len(present) != 1 or present[0] not in ClientMessage.model_fields:
        names = ", ".join(sorted(to_camel(k) for k in present)[:4]) or "none"
        raise SessionError(
            ErrorCode.INVALID_MESSAGE,
            f"a message holds exactly one of setup, clientContent, realtimeInput, toolResponse (got {names})",
        )
    try:
        return ClientMessage.model_validate(obj)
    except ValidationError as exc:
        reason = f"{to_camel(present[0])}: {_camel(describe_validation_error(exc))}"
        raise SessionError(ErrorCode.INVALID_MESSAGE, reason) from None


def _camel(text: str) -> str:
    """A validation message's field names as the Live docs spell them."""
    return re.sub(r"[a-z]+(?:_[a-z0-9]+)+", lambda m: to_camel(m.group(0)), text)


# --------------------------------------------------------------------------- server messages


class _Out(BaseModel):
    """A server object: serialized in lowerCamelCase, unset fields left out."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class InlineData(_Out):
    mime_type: str
    data: str


class OutPart(_Out):
    text: str | None = None
    inline_data: InlineData | None = None


class ModelTurn(_Out):
    role: Literal["model"] = "model"
    parts: list[OutPart]


class Transcription(_Out):
    text: str | None = None
    finished: bool | None = None


class ServerContent(_Out):
    model_turn: ModelTurn | None = None
    generation_complete: bool | None = None
    turn_complete: bool | None = None
    interrupted: bool | None = None
    input_transcription: Transcription | None = None
    output_transcription: Transcription | None = None


class ModalityTokenCount(_Out):
    modality: Literal["TEXT", "IMAGE", "AUDIO"]
    token_count: int


class UsageMetadata(_Out):
    prompt_token_count: int
    cached_content_token_count: int
    response_token_count: int
    total_token_count: int
    prompt_tokens_details: list[ModalityTokenCount]
    response_tokens_details: list[ModalityTokenCount]


class SetupComplete(_Out):
    session_id: str | None = None


class GoAway(_Out):
    time_left: str  # a proto3 JSON duration: "12.5s"


class SessionResumptionUpdate(_Out):
    new_handle: str | None = None
    resumable: bool
    last_consumed_client_message_index: str | None = None  # int64: a JSON string in proto3 JSON


class ServerMessage(_Out):
    setup_complete: SetupComplete | None = None
    server_content: ServerContent | None = None
    usage_metadata: UsageMetadata | None = None
    go_away: GoAway | None = None
    session_resumption_update: SessionResumptionUpdate | None = None

    def encode(self) -> str:
        """The message as the JSON text sent."""
        return self.model_dump_json(by_alias=True, exclude_none=True)
