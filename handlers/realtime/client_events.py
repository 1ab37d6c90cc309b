"""OpenAI Realtime's client events (and the parts they hold) and their one parser.

``parse_realtime_event`` reads a message through the JSON front end every protocol shares
(``handlers/wire/strict_json.py``: no ``NaN``, no lone surrogate, bounded nesting, the same
code as v1 for each), then into exactly one event; a ``session.update`` is read part by part.
``handlers/realtime/events.py`` lists the whole protocol.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

from handlers.wire.client_events import TimeRange
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.fields import MAX_INSTRUCTIONS_CHARS, MAX_ITEM_TEXT_CHARS
from handlers.wire.strict_json import read_json_object

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
    """livesight's own settings, under ``session.livesight`` (see ``session.config``): the
    fields of ``handlers/wire/fields.py``'s ``LIVESIGHT_FIELDS``, in its order (a core test
    holds them equal), typed loosely: the session's config judges their values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_frames: int | None = None
    max_frames: int | None = None
    enable_frame_filter: bool | None = None
    frame_filter_threshold: float | None = None
    frame_timestamps: bool | None = None
    prefix_warmup: bool | None = None
    use_audio_in_video: bool | None = None
    watches: list[dict[str, Any]] | None = Field(None, max_length=64)  # as session.config's (see protocol.md)
    memory: dict[str, Any] | None = None  # as session.config's
    camera_fps: float | None = None


class RealtimeSession(_Part):
    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    max_output_tokens: int | Literal["inf"] | None = None
    audio: SessionAudio | None = None
    livesight: LivesightSettings | None = None


class ContentPart(_Part):
    type: Literal["input_text", "input_image", "input_audio", "text", "output_text", "output_audio", "audio"]
    text: str | None = Field(None, max_length=MAX_ITEM_TEXT_CHARS)
    image_url: str | None = None
    audio: str | None = None
    transcript: str | None = Field(None, max_length=MAX_ITEM_TEXT_CHARS)
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


class ResponseLivesight(_Part):
    """livesight's own response fields: ``range`` asks about the session's past (its
    remembered moments, as ``video.query``'s ``range``)."""

    range: TimeRange | None = None


class ResponseParams(_Part):
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    max_output_tokens: int | Literal["inf"] | None = None
    conversation: Literal["auto", "none"] | None = None
    metadata: dict[str, str] | None = None
    input: list[ResponseInputItem] | None = Field(None, max_length=64)
    audio: ResponseAudio | None = None
    livesight: ResponseLivesight | None = None


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


class LivesightMemorySearch(_ClientEvent):
    """livesight's ``memory.search`` (protocol.md) on this endpoint: its fields, judged there."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["livesight.memory.search"]

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class LivesightMemoryClear(_ClientEvent):
    type: Literal["livesight.memory.clear"]


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
    | ResponseCancel
    | LivesightMemorySearch
    | LivesightMemoryClear,
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
        "livesight.memory.search",
        "livesight.memory.clear",
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


def parse_realtime_event(
    raw: str | bytes, *, max_bytes: int | None = None
) -> tuple[RealtimeClientEvent | None, str | None]:
    """Parse one message; returns the event and its ``event_id``. A ``session.update`` is
    read part by part: what is not valid is left out and listed in its ``_refused``.
    ``max_bytes``: the largest message (``read_json_object``).

    Raises ``SessionError`` (``invalid_json``, ``invalid_message``, ``unknown_type``); the
    message's ``event_id`` and ``type``, when it had them, are on the exception's ``origin``,
    and OpenAI's code for the problem on its ``wire_code``.
    """
    obj = read_json_object(raw, max_bytes=max_bytes)  # refused: no origin, nothing of it is echoed
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

