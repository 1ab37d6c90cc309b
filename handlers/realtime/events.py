"""The OpenAI Realtime protocol (GA shape) on ``/v1/realtime``, as typed events.

Client -> server (JSON text messages, each with a ``type`` and an optional ``event_id``):

    session.update               session: type "realtime", instructions, output_modalities
                                 (["text"] or ["audio"]), max_output_tokens, audio.input
                                 (format, turn_detection server_vad / semantic_vad with
                                 create_response / interrupt_response, transcription,
                                 noise_reduction), audio.output (format, voice, speed),
                                 livesight (num_frames, max_frames, enable_frame_filter,
                                 frame_filter_threshold, frame_timestamps, prefix_warmup,
                                 use_audio_in_video, watches); read field by field: a part
                                 that is wrong is refused alone
    input_audio_buffer.append    audio (base64, in audio.input.format)
    input_audio_buffer.commit
    input_audio_buffer.clear
    conversation.item.create     previous_item_id, item: a message; user content input_text /
                                 input_image (data URL, JPEG/PNG/WebP; detail) / input_audio;
                                 assistant content output_text / text / output_audio with
                                 transcript; system content input_text
    conversation.item.delete     item_id
    conversation.item.retrieve   item_id
    conversation.item.truncate   item_id, content_index, audio_end_ms
    output_audio_buffer.clear
    response.create              response: instructions, output_modalities,
                                 max_output_tokens, conversation ("auto" / "none"), metadata,
                                 input (messages and item_reference items)
    response.cancel              response_id

Server -> client:

    session.created, session.updated, conversation.item.added, conversation.item.done,
    conversation.item.deleted, conversation.item.retrieved, conversation.item.truncated,
    output_audio_buffer.cleared,
    input_audio_buffer.speech_started, input_audio_buffer.speech_stopped,
    input_audio_buffer.committed, input_audio_buffer.cleared,
    input_audio_buffer.timeout_triggered,
    conversation.item.input_audio_transcription.completed, response.created,
    response.output_item.added, response.output_item.done, response.content_part.added,
    response.content_part.done, response.output_text.delta, response.output_text.done,
    response.output_audio.delta, response.output_audio.done,
    response.output_audio_transcript.delta, response.output_audio_transcript.done,
    response.done, error

Incoming messages are parsed once, by ``parse_realtime_event``; outgoing events are models
serialised by ``encode_realtime`` (fields that are None are left out).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

from handlers.wire.errors import ErrorCode, Origin, SessionError

Modality = Literal["text", "audio"]
FormatType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]

# --------------------------------------------------------------------------- shared parts


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class AudioFormat(_Part):
    """``audio/pcm`` is PCM16 at 24 kHz; ``audio/pcmu`` and ``audio/pcma`` are G.711 at 8 kHz."""

    type: FormatType = "audio/pcm"
    rate: Literal[24000] | None = None


class ServerVad(_Part):
    type: Literal["server_vad"] = "server_vad"
    threshold: float | None = Field(None, ge=0.05, le=0.95)
    prefix_padding_ms: int | None = Field(None, ge=0, le=2000)
    silence_duration_ms: int | None = Field(None, ge=100, le=5000)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = Field(None, ge=5000, le=30000)


class SemanticVad(_Part):
    """Served by the server's VAD: ``eagerness`` sets how long a silence ends a turn
    (``SEMANTIC_SILENCE_MS``)."""

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


#: ``semantic_vad`` eagerness -> the silence (ms) that ends a spoken turn on the server's VAD.
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 700, "auto": 700, "high": 400}


class AudioInput(_Part):
    format: AudioFormat | None = None
    turn_detection: Annotated[ServerVad | SemanticVad, Field(discriminator="type")] | None = None
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioOutput(_Part):
    format: AudioFormat | None = None
    voice: str | None = Field(None, max_length=200)
    speed: float | None = Field(None, ge=0.25, le=1.5)


class SessionAudio(_Part):
    input: AudioInput | None = None
    output: AudioOutput | None = None


class LivesightSettings(_Part):
    """livesight's own settings, under ``session.livesight`` (see ``session.config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_frames: int | None = None
    max_frames: int | None = None
    enable_frame_filter: bool | None = None
    frame_filter_threshold: float | None = None
    frame_timestamps: bool | None = None
    prefix_warmup: bool | None = None
    use_audio_in_video: bool | None = None
    watches: list[dict[str, Any]] | None = Field(None, max_length=64)  # as session.config's (see protocol.md)


class RealtimeSession(_Part):
    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str | None = Field(None, max_length=20_000)
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    max_output_tokens: int | Literal["inf"] | None = None
    audio: SessionAudio | None = None
    livesight: LivesightSettings | None = None


class ContentPart(_Part):
    type: Literal["input_text", "input_image", "input_audio", "text", "output_text", "output_audio", "audio"]
    text: str | None = Field(None, max_length=20_000)
    image_url: str | None = None
    audio: str | None = None
    transcript: str | None = Field(None, max_length=20_000)
    detail: Literal["low", "high", "auto"] | None = None


class MessageItem(_Part):
    id: str | None = Field(None, min_length=1, max_length=64)
    type: Literal["message"] = "message"
    role: Literal["user", "system", "assistant"]
    content: list[ContentPart] = Field(min_length=1, max_length=32)


class ItemReference(_Part):
    """An existing conversation item, in a response's ``input``."""

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=64)


ResponseInputItem = Annotated[MessageItem | ItemReference, Field(discriminator="type")]


class ResponseAudio(_Part):
    output: AudioOutput | None = None


class ResponseParams(_Part):
    instructions: str | None = Field(None, max_length=20_000)
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    max_output_tokens: int | Literal["inf"] | None = None
    conversation: Literal["auto", "none"] | None = None
    metadata: dict[str, str] | None = None
    input: list[ResponseInputItem] | None = Field(None, max_length=64)
    audio: ResponseAudio | None = None


# --------------------------------------------------------------------------- client events


class _ClientEvent(_Part):
    event_id: str | None = Field(None, max_length=128)


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"]
    session: RealtimeSession

    #: The parts of the client's session that were not valid, each with why (left out of ``session``).
    _refused: list[str] = PrivateAttr(default_factory=list)
    #: The fields of the client's session this server does not know (``tools``, ``tracing``, ...).
    _ignored: list[str] = PrivateAttr(default_factory=list)


class InputAudioBufferAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"]
    item: MessageItem
    previous_item_id: str | None = None


class ConversationItemDelete(_ClientEvent):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemRetrieve(_ClientEvent):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemTruncate(_ClientEvent):
    type: Literal["conversation.item.truncate"]
    item_id: str = Field(max_length=256)
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0)


class OutputAudioBufferClear(_ClientEvent):
    type: Literal["output_audio_buffer.clear"]


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"]
    response_id: str | None = None


RealtimeClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemDelete
    | ConversationItemRetrieve
    | ConversationItemTruncate
    | OutputAudioBufferClear
    | ResponseCreate
    | ResponseCancel,
    Field(discriminator="type"),
]
_client_event = TypeAdapter(RealtimeClientEvent)
REALTIME_CLIENT_TYPES = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "output_audio_buffer.clear",
        "response.create",
        "response.cancel",
    }
)


def _wire_code(error: dict[str, Any]) -> str:
    """OpenAI's code for one validation problem."""
    if error["type"] == "missing":
        return "missing_required_parameter"
    if error["type"] == "extra_forbidden":
        return "unknown_parameter"
    return "invalid_value"


def _part_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model of field ``name`` when it is one nested part (not a union of several)."""
    field = model.model_fields.get(name)
    if field is None:
        return None
    parts = [a for a in (get_args(field.annotation) or (field.annotation,)) if isinstance(a, type) and issubclass(a, _Part)]
    return parts[0] if len(parts) == 1 else None


def _lenient(
    model: type[BaseModel], data: dict[str, Any], path: str, ignored: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """``data`` without its parts that are not valid for ``model`` (a nested part is read the
    same way), and a line for each part left out; fields ``model`` does not know are added to
    ``ignored``."""
    kept: dict[str, Any] = {}
    refused: list[str] = []
    for name, value in data.items():
        if name not in model.model_fields and model.model_config.get("extra") != "forbid":
            ignored.append(f"{path}{name}")
            continue
        part = _part_model(model, name)
        if part is not None and isinstance(value, dict):
            kept[name], more = _lenient(part, value, f"{path}{name}.", ignored)
            refused += more
            continue
        try:
            model.model_validate({name: value})
            kept[name] = value
        except ValidationError as exc:
            refused.append(f"{path}{name}: {exc.errors()[0]['msg']}")
    return kept, refused


def _session_update(obj: dict[str, Any]) -> SessionUpdate:
    session = obj.get("session")
    if not isinstance(session, dict):
        return _client_event.validate_python(obj)  # type: ignore[return-value]  # raises: not an object
    ignored: list[str] = []
    kept, refused = _lenient(RealtimeSession, session, "session.", ignored)
    event = SessionUpdate.model_validate({**obj, "session": kept})
    event._refused, event._ignored = refused, ignored
    return event


def parse_realtime_event(raw: str | bytes) -> tuple[RealtimeClientEvent | None, str | None]:
    """Parse one message; returns the event and its ``event_id``. A ``session.update`` is
    read part by part: what is not valid is left out and listed in its ``_refused``.

    Raises ``SessionError`` (``invalid_json``, ``invalid_message``, ``unknown_type``); the
    message's ``event_id`` and ``type``, when it had them, are on the exception's ``origin``,
    and OpenAI's code for the problem on its ``wire_code``.
    """
    if isinstance(raw, bytes):
        raise SessionError(ErrorCode.INVALID_MESSAGE, "binary messages are not supported; send JSON text")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise SessionError(ErrorCode.INVALID_JSON, "message is not valid JSON") from None
    if not isinstance(obj, dict):
        raise SessionError(ErrorCode.INVALID_MESSAGE, "message must be a JSON object")
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    kind = obj.get("type")
    try:
        if not isinstance(kind, str):
            raise SessionError(ErrorCode.INVALID_MESSAGE, 'message has no string "type"')
        if kind not in REALTIME_CLIENT_TYPES:
            error = SessionError(ErrorCode.UNKNOWN_TYPE, f"unknown or unsupported event type {kind[:64]!r}")
            error.wire_code = "invalid_value"
            raise error
        try:
            if kind == "session.update":
                return _session_update(obj), event_id
            return _client_event.validate_python(obj), event_id
        except ValidationError as exc:
            errors = exc.errors()
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'][1:]) or 'message'}: {err['msg']}" for err in errors[:5]
            )
            error = SessionError(ErrorCode.INVALID_MESSAGE, f"{kind}: {problems}")
            error.wire_code = _wire_code(errors[0])
            raise error from None
    except SessionError as exc:
        exc.origin = Origin(event_id, kind if isinstance(kind, str) else "")
        raise


# --------------------------------------------------------------------------- server events


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class ServerVadOut(_Out):
    type: Literal["server_vad"] = "server_vad"
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


class SemanticVadOut(_Out):
    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True


class AudioInputOut(_Out):
    format: AudioFormat
    turn_detection: ServerVadOut | SemanticVadOut | None
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioOutputOut(_Out):
    format: AudioFormat
    voice: str | None = None
    speed: float = 1.0


class SessionAudioOut(_Out):
    input: AudioInputOut
    output: AudioOutputOut


class SessionOut(_Out):
    """The session as ``session.created`` / ``session.updated`` show it."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str
    model: str
    instructions: str = ""
    output_modalities: list[Modality]
    max_output_tokens: int | Literal["inf"]
    audio: SessionAudioOut
    tools: list[Any] = Field(default_factory=list)
    tool_choice: Literal["auto"] = "auto"
    livesight: dict[str, Any]


class ItemContent(_Out):
    type: Literal["input_text", "input_image", "input_audio", "output_text", "output_audio"]
    text: str | None = None
    transcript: str | None = None
    image_url: str | None = None


class Item(_Out):
    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    status: Literal["completed", "incomplete", "in_progress"] = "completed"
    role: Literal["user", "system", "assistant"]
    content: list[ItemContent] = Field(default_factory=list)


class StatusError(_Out):
    type: str
    code: str | None = None


class StatusDetails(_Out):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: StatusError | None = None


class InputTokenDetails(_Out):
    """``text_tokens + image_tokens + audio_tokens == input_tokens``; ``cached_tokens`` is a
    part of ``input_tokens`` too (reused from the engine's cache)."""

    cached_tokens: int
    text_tokens: int
    image_tokens: int
    audio_tokens: int


class OutputTokenDetails(_Out):
    """The model writes text; spoken answers are synthesized from it (``audio_tokens`` 0)."""

    text_tokens: int
    audio_tokens: int = 0


class Usage(_Out):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails


class ResponseOut(_Out):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"]
    status_details: StatusDetails | None = None
    output: list[Item] = Field(default_factory=list)
    conversation_id: str | None = None
    output_modalities: list[Modality]
    max_output_tokens: int | Literal["inf"] | None = None
    usage: Usage | None = None
    metadata: dict[str, str] | None = None  # a response the server started: which watch fired


class ContentPartOut(_Out):
    type: Literal["text", "audio"]
    text: str | None = None
    transcript: str | None = None


class ErrorDetail(_Out):
    type: Literal["invalid_request_error", "server_error"]
    code: str
    message: str
    param: str | None = None
    event_id: str | None = None


class RealtimeServerEvent(_Out):
    event_id: str


class SessionCreated(RealtimeServerEvent):
    type: Literal["session.created"] = "session.created"
    session: SessionOut


class SessionUpdated(RealtimeServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: SessionOut


class ConversationItemAdded(RealtimeServerEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None = None
    item: Item


class ConversationItemDone(RealtimeServerEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None = None
    item: Item


class ConversationItemDeleted(RealtimeServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ConversationItemRetrieved(RealtimeServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: Item


class ConversationItemTruncated(RealtimeServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class OutputAudioBufferCleared(RealtimeServerEvent):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str


class SpeechStarted(RealtimeServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(RealtimeServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class AudioBufferCommitted(RealtimeServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    previous_item_id: str | None = None
    item_id: str


class TimeoutTriggered(RealtimeServerEvent):
    """``server_vad.idle_timeout_ms`` passed in silence after an answer: a response follows."""

    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    item_id: str
    audio_start_ms: int
    audio_end_ms: int


class AudioBufferCleared(RealtimeServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class TranscriptionUsage(_Out):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionCompleted(RealtimeServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int = 0
    transcript: str
    usage: TranscriptionUsage


class ResponseCreated(RealtimeServerEvent):
    type: Literal["response.created"] = "response.created"
    response: ResponseOut


class ResponseDone(RealtimeServerEvent):
    type: Literal["response.done"] = "response.done"
    response: ResponseOut


class OutputItemAdded(RealtimeServerEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    response_id: str
    output_index: int = 0
    item: Item


class OutputItemDone(RealtimeServerEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    response_id: str
    output_index: int = 0
    item: Item


class _InResponse(RealtimeServerEvent):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartAdded(_InResponse):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: ContentPartOut


class ContentPartDone(_InResponse):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: ContentPartOut


class OutputTextDelta(_InResponse):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class OutputTextDone(_InResponse):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class OutputAudioDelta(_InResponse):
    """``delta``: base64 audio in ``audio.output.format`` (raw samples, no WAV header)."""

    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str


class OutputAudioDone(_InResponse):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class OutputAudioTranscriptDelta(_InResponse):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class OutputAudioTranscriptDone(_InResponse):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class RealtimeError(RealtimeServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail


#: Every server event type this server sends (the docs list each one).
REALTIME_SERVER_TYPES = frozenset(
    cls.model_fields["type"].default
    for cls in RealtimeServerEvent.__subclasses__() + _InResponse.__subclasses__()
    if "type" in cls.model_fields
)


def encode_realtime(event: RealtimeServerEvent) -> str:
    """Serialise a server event (None fields left out)."""
    return event.model_dump_json(exclude_none=True)
