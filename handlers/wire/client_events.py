"""Protocol v1's client events (the messages a client sends) and their one strict parser.

``parse_client_event`` reads a message through the JSON front end (``strict_json.py``), then
into exactly one of these events: fields of exactly their type (``"4"``, ``true`` and ``4.0``
are not integers; an integer is a valid float), finite numbers, and sampling values every
engine accepts. ``handlers/wire/protocol.py`` lists the whole protocol.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.fields import (
    MAX_ANSWER_TOKENS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_QUESTION_CHARS,
    MAX_SEED,
    MIN_TEMPERATURE,
    FrameId,
)
from handlers.wire.strict_json import read_json_object

_STRICT = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)


class _ClientEvent(BaseModel):
    model_config = _STRICT

    #: The wire event it was decoded from, when another codec made it (its errors name that event).
    _origin: Origin | None = PrivateAttr(None)


class SamplingConfig(BaseModel):
    """Sampling for the text stage. ``temperature`` 0 is greedy, else at least 0.01."""

    model_config = _STRICT

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(128, ge=1, le=MAX_ANSWER_TOKENS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)

    @field_validator("temperature")
    @classmethod
    def _not_tiny(cls, value: float) -> float:
        if 0.0 < value < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return value


class TurnDetection(BaseModel):
    """``session.config.turn_detection``: the server finds where spoken questions end.

    ``threshold``: speech probability that starts speech (higher ignores more noise);
    ``silence_ms``: silence that ends it; ``prefix_padding_ms``: audio kept from before the
    start. ``silence_duration_ms`` is accepted for ``silence_ms`` (OpenAI's name).
    ``create_response``: the end of speech starts an answer (false: the spoken turn waits
    for the next question or ``response.create``); ``interrupt_response``: speech that
    starts during an answer interrupts it (false: the answer goes on, and the words spoken
    over it wait like ``create_response: false``). Both default true, as in OpenAI's API.
    ``idle_timeout_ms``: when nobody speaks for this long after an answer (counted from its
    end plus the length of its audio), an answer starts without a question (none by default).
    """

    model_config = _STRICT

    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.05, le=0.95)
    silence_ms: int = Field(500, ge=100, le=5000)
    prefix_padding_ms: int = Field(300, ge=0, le=2000)
    create_response: bool = True
    interrupt_response: bool = True
    #: After an answer's audio has had time to play, this much silence starts an answer by itself.
    idle_timeout_ms: int | None = Field(None, ge=5000, le=30000)

    @model_validator(mode="before")
    @classmethod
    def _openai_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and "silence_duration_ms" in data:
            data = dict(data)
            data.setdefault("silence_ms", data.pop("silence_duration_ms"))
        return data


class TurnDetectionChange(BaseModel):
    """Turn detection as another protocol's client asked for it, in ``TurnDetection``'s terms:
    only the fields it gave, the others left to their defaults (the session's config checks
    the ranges, so a value out of range is refused there, as on v1)."""

    model_config = ConfigDict(frozen=True)

    threshold: float | None = None
    silence_ms: int | None = None
    prefix_padding_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None

    def as_config(self) -> dict[str, Any]:
        """The ``session.config.turn_detection`` value: the fields given."""
        return self.model_dump(exclude_none=True)


_ALIASES = {
    "num_sample_frames": "num_frames",
    "evs_enabled": "enable_frame_filter",
    "evs_threshold": "frame_filter_threshold",
}


WatchId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class WatchResponse(BaseModel):
    """What a fired watch's answer is asked: ``instructions`` (else a short description of
    what happened) and its length."""

    model_config = _STRICT

    instructions: str | None = Field(None, max_length=2_000)
    max_tokens: int | None = Field(None, ge=1, le=MAX_ANSWER_TOKENS)


class WatchSpec(BaseModel):
    """A standing instruction: a yes/no ``condition`` checked on the warm prefix after
    accepted frames. ``alert``: fires when the condition becomes true (``confirm`` checks in a
    row at ``threshold`` or more), then re-arms after ``clear`` checks at ``clear_threshold``
    or less, and fires at most once per ``cooldown_s``. ``narrate``: fires when the scene
    changed in a way worth saying (the condition, by default "has something changed"), at
    most every ``min_interval_s``, with no re-arming needed."""

    model_config = _STRICT

    watch_id: WatchId | None = None  # the server names it when absent
    condition: str | None = Field(None, min_length=1, max_length=1_000)
    kind: Literal["alert", "narrate"] = "alert"
    threshold: float = Field(0.6, ge=0.0, le=1.0)
    clear_threshold: float = Field(0.4, ge=0.0, le=1.0)
    confirm: int = Field(1, ge=1, le=100)
    clear: int = Field(2, ge=1, le=100)
    cooldown_s: float = Field(10.0, ge=0.0, le=86_400.0)
    min_interval_s: float = Field(10.0, ge=0.0, le=86_400.0)
    response: WatchResponse = Field(default_factory=WatchResponse)
    report_checks: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> WatchSpec:
        if self.clear_threshold > self.threshold:
            raise ValueError("clear_threshold must not be above threshold")
        if self.kind == "alert" and not self.condition:
            raise ValueError("an alert watch needs a condition")
        if self.condition is not None and not self.condition.strip():
            raise ValueError("condition is blank")
        return self


class MemorySettings(BaseModel):
    """``session.config.memory``: whether the session keeps moments of what it saw (None:
    the server's default, ``memory_default``)."""

    model_config = _STRICT

    enabled: bool | None = None


#: Wall-clock times of memory (ms since the epoch; a negative value is that long before now).
MemoryTime = Annotated[float, Field(ge=-1e13, le=1e14)]


class TimeRange(BaseModel):
    """A span of the session's past: ``from_ms`` to ``to_ms`` (absent: now)."""

    model_config = _STRICT

    from_ms: MemoryTime
    to_ms: MemoryTime | None = None


class SessionConfig(_ClientEvent):
    """``session.config``: the first message of every session."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    type: Literal["session.config"] = "session.config"
    model: str | None = None
    modalities: list[Literal["text", "audio"]] = Field(default_factory=lambda: ["text"])
    num_frames: int | None = Field(None, ge=1, le=128)  # None: 4, or max_frames with a warm prefix
    max_frames: int = Field(50, ge=1, le=256)
    system_prompt: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    use_audio_in_video: bool = True
    enable_frame_filter: bool = True
    frame_filter_threshold: float | None = Field(None, ge=0.0, le=1.0)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    sampling_params_list: list[dict[str, Any]] | None = None
    voice: str | None = Field(None, max_length=200)
    speech_rate: float = Field(1.0, ge=0.5, le=2.0)
    turn_detection: TurnDetection | None = None
    frame_timestamps: bool = True
    prefix_warmup: bool = True
    resume_token: str | None = Field(None, max_length=200)
    watches: list[WatchSpec] = Field(default_factory=list, max_length=64)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    #: Frames a second the server samples from a camera it receives as video (a WebRTC
    #: call's camera track); frames sent as images are not sampled.
    camera_fps: float = Field(2.0, gt=0.0, le=30.0)

    @model_validator(mode="before")
    @classmethod
    def _apply_aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, name in _ALIASES.items():
            if legacy in data:
                value = data.pop(legacy)
                data.setdefault(name, value)
        stages = data.get("sampling_params_list")
        if isinstance(stages, list) and stages and isinstance(stages[0], dict):
            # vLLM-Omni's per-stage form: the first stage is the text stage. Fields the
            # client also gave in `sampling` win.
            text_stage = {k: v for k, v in stages[0].items() if k in SamplingConfig.model_fields}
            explicit = data.get("sampling") if isinstance(data.get("sampling"), dict) else {}
            data["sampling"] = {**text_stage, **explicit}
        return data

    @field_validator("modalities")
    @classmethod
    def _text_first(cls, value: list[str]) -> list[str]:
        if "text" not in value:
            raise ValueError('modalities must include "text"')
        return list(dict.fromkeys(value))

    @property
    def ignored_fields(self) -> list[str]:
        """Fields the client sent that this server does not know."""
        return sorted(self.model_extra or {})


class VideoFrame(_ClientEvent):
    type: Literal["video.frame"]
    data: str
    frame_id: FrameId | None = None
    pts_ms: float | None = None
    source_pts_ms: float | None = None
    capture_ts_ms: float | None = None
    quality_profile: str | None = Field(None, max_length=64)
    #: ``low``: sent to the model smaller (fewer tokens); ``high`` / ``auto``: at the largest size it takes.
    detail: Literal["low", "high", "auto"] | None = None


class AudioChunkIn(_ClientEvent):
    type: Literal["audio.chunk"]
    data: str


class VideoQuery(_ClientEvent):
    type: Literal["video.query"]
    text: str = Field("", max_length=MAX_QUESTION_CHARS)
    audio_data: str | None = None
    #: Ask about the past: the prompt shows that range's remembered moments, not the window.
    range: TimeRange | None = None


SearchId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class MemorySearch(_ClientEvent):
    """``memory.search``: the session's remembered moments where ``condition`` (a yes/no
    question, checked on each moment's keyframe) holds, and/or whose captions, transcripts,
    questions or answers contain ``text``, between ``from_ms`` and ``to_ms``."""

    type: Literal["memory.search"]
    search_id: SearchId | None = None
    condition: str | None = Field(None, min_length=1, max_length=1_000)
    text: str | None = Field(None, min_length=1, max_length=500)
    from_ms: MemoryTime | None = None
    to_ms: MemoryTime | None = None
    limit: int = Field(20, ge=1, le=200)
    threshold: float = Field(0.5, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _asks_something(self) -> MemorySearch:
        if not (self.condition or "").strip() and not (self.text or "").strip():
            raise ValueError("give a condition, a text, or both")
        return self


class MemoryClear(_ClientEvent):
    """``memory.clear``: forget everything the session remembers (deleted from the store)."""

    type: Literal["memory.clear"]


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"]


class VideoDone(_ClientEvent):
    type: Literal["video.done"]


class Ping(_ClientEvent):
    type: Literal["ping"]


class WatchCreate(WatchSpec):
    type: Literal["watch.create"]


class WatchUpdate(_ClientEvent):
    """``watch.update``: the fields to change (the others keep their values)."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    type: Literal["watch.update"]
    watch_id: WatchId

    @property
    def changes(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class WatchDelete(_ClientEvent):
    type: Literal["watch.delete"]
    watch_id: WatchId


ClientEvent = Annotated[
    VideoFrame | AudioChunkIn | VideoQuery | ResponseCancel | VideoDone | Ping | SessionConfig
    | WatchCreate | WatchUpdate | WatchDelete | MemorySearch | MemoryClear,
    Field(discriminator="type"),
]
_client_event = TypeAdapter(ClientEvent)
CLIENT_TYPES = frozenset(
    {"session.config", "video.frame", "audio.chunk", "video.query", "response.cancel", "video.done", "ping",
     "watch.create", "watch.update", "watch.delete", "memory.search", "memory.clear"}
)


def parse_client_event(raw: str | bytes, *, configured: bool = False, max_bytes: int | None = None) -> ClientEvent:
    """Parse one WebSocket message into a client event.

    ``configured``: the session already has its config, so a bad ``session.config`` is an
    ``invalid_message`` (the session goes on), not an ``invalid_config`` (which closes it).
    ``max_bytes``: the largest message (``strict_json.read_json_object``).
    Raises ``SessionError`` with ``invalid_json``, ``invalid_message``, ``invalid_config``,
    ``unknown_type`` or ``invalid_watch`` (a ``watch.create`` whose fields do not validate).
    """
    obj = read_json_object(raw, max_bytes=max_bytes)
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise SessionError(ErrorCode.INVALID_MESSAGE, 'message has no string "type"')
    if kind not in CLIENT_TYPES:
        raise SessionError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}")
    bad_code = ErrorCode.INVALID_CONFIG if kind == "session.config" and not configured else ErrorCode.INVALID_MESSAGE
    if kind == "watch.create":  # a watch's fields are judged as watch.update's changes are
        bad_code = ErrorCode.INVALID_WATCH
    try:
        return _client_event.validate_python(obj)
    except ValidationError as exc:
        raise SessionError(bad_code, f"{kind}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """A short, client-safe summary of what was wrong with which fields."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"] if p not in {"session.config"}) or "message"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def origin_of(event: object) -> Origin | None:
    """The wire event a client event or core command was decoded from (None for v1's own)."""
    return getattr(event, "_origin", None)

