"""Protocol v1: every message on ``/v1/video/chat/stream``, as typed events.

Client -> server (JSON text messages, each an object with a ``type``):

    session.config   first message: model, modalities, num_frames, max_frames, system_prompt,
                     use_audio_in_video, enable_frame_filter, frame_filter_threshold, sampling,
                     sampling_params_list, voice, speech_rate, turn_detection,
                     frame_timestamps, prefix_warmup, resume_token
                     (aliases: num_sample_frames, evs_enabled, evs_threshold)
    video.frame      data (base64 JPEG/PNG/WebP), frame_id, pts_ms, source_pts_ms,
                     capture_ts_ms, quality_profile, detail (low / high / auto)
    audio.chunk      data (base64 PCM16 LE, 16 kHz, mono)
    video.query      text, audio_data
    response.cancel  stop the running answer
    video.done       finish after the running answer
    ping
    watch.create     a standing instruction: watch_id, condition, kind (alert, narrate),
                     threshold, clear_threshold, confirm, clear, cooldown_s, min_interval_s,
                     response (instructions, max_tokens), report_checks
    watch.update     watch_id and the fields to change
    watch.delete     watch_id

Server -> client:

    session.ready, video.frame.ack, video.frames.consumed, response.start,
    response.text.delta, response.text.done, response.output_audio.delta,
    response.output_audio.done, response.done, session.done, error, pong,
    session.closing                                           (server shutdown: drain)
    input_audio.speech_started, input_audio.speech_stopped   (server turn detection)
    input_audio.transcript                                    (a spoken question as text)
    watch.created, watch.updated, watch.deleted, watch.check, watch.fired, watch.cleared

Incoming messages are parsed once, here, by ``parse_client_event``; outgoing events are
built as models and serialised by ``encode``. Parsing is strict: JSON as the standard has it
(no ``NaN``/``Infinity``), no string holding a lone surrogate (it is not Unicode and could not
be sent back), fields of exactly their type (``"4"``, ``true`` and ``4.0`` are not integers;
an integer is a valid float), finite numbers, and sampling values every engine accepts.
A client parses the server's events back, typed, with ``parse_server_event``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from handlers.wire.errors import ErrorCode, Origin, SessionError

#: A frame id: a short string or a 64-bit integer (it is echoed in acks and errors).
FrameId = Annotated[str, Field(max_length=256)] | Annotated[int, Field(ge=-(2**63), lt=2**63)]
#: The smallest non-zero temperature: below it, logits / temperature overflows (vLLM clamps
#: to the same value; the embedded engine's softmax would give NaN).
MIN_TEMPERATURE = 0.01
#: Seeds are 63-bit: every engine's generator takes them (a torch seed over 2^64 fails).
MAX_SEED = 2**63 - 1
_STRICT = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)

# --------------------------------------------------------------------------- client events


class _ClientEvent(BaseModel):
    model_config = _STRICT

    #: The wire event it was decoded from, when another codec made it (its errors name that event).
    _origin: Origin | None = PrivateAttr(None)


class SamplingConfig(BaseModel):
    """Sampling for the text stage. ``temperature`` 0 is greedy, else at least 0.01."""

    model_config = _STRICT

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(128, ge=1, le=4096)
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
    max_tokens: int | None = Field(None, ge=1, le=4096)


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


class SessionConfig(_ClientEvent):
    """``session.config``: the first message of every session."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    type: Literal["session.config"] = "session.config"
    model: str | None = None
    modalities: list[Literal["text", "audio"]] = Field(default_factory=lambda: ["text"])
    num_frames: int | None = Field(None, ge=1, le=128)  # None: 4, or max_frames with a warm prefix
    max_frames: int = Field(50, ge=1, le=256)
    system_prompt: str | None = Field(None, max_length=20_000)
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
    text: str = Field("", max_length=20_000)
    audio_data: str | None = None


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
    | WatchCreate | WatchUpdate | WatchDelete,
    Field(discriminator="type"),
]
_client_event = TypeAdapter(ClientEvent)
CLIENT_TYPES = frozenset(
    {"session.config", "video.frame", "audio.chunk", "video.query", "response.cancel", "video.done", "ping",
     "watch.create", "watch.update", "watch.delete"}
)


def parse_client_event(raw: str | bytes, *, configured: bool = False) -> ClientEvent:
    """Parse one WebSocket message into a client event.

    ``configured``: the session already has its config, so a bad ``session.config`` is an
    ``invalid_message`` (the session goes on), not an ``invalid_config`` (which closes it).
    Raises ``SessionError`` with ``invalid_json``, ``invalid_message``, ``invalid_config``,
    ``unknown_type`` or ``invalid_watch`` (a ``watch.create`` whose fields do not validate).
    """
    if isinstance(raw, bytes):
        raise SessionError(ErrorCode.INVALID_MESSAGE, "binary messages are not supported; send JSON text")
    try:
        obj = _json_decoder.decode(raw)
    except (ValueError, RecursionError):
        raise SessionError(ErrorCode.INVALID_JSON, "message is not valid JSON") from None
    if not isinstance(obj, dict):
        raise SessionError(ErrorCode.INVALID_MESSAGE, "message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise SessionError(ErrorCode.INVALID_MESSAGE, 'message has no string "type"')
    bad_code = ErrorCode.INVALID_CONFIG if kind == "session.config" and not configured else ErrorCode.INVALID_MESSAGE
    if not _is_unicode(obj):
        raise SessionError(bad_code, "a string in the message holds a lone surrogate (\\ud800-\\udfff): not Unicode text")
    if kind not in CLIENT_TYPES:
        raise SessionError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}")
    if kind == "watch.create":  # a watch's fields are judged as watch.update's changes are
        bad_code = ErrorCode.INVALID_WATCH
    try:
        return _client_event.validate_python(obj)
    except ValidationError as exc:
        raise SessionError(bad_code, f"{kind}: {describe_validation_error(exc)}") from None


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for every message (``json.loads`` with an argument builds a new one per call).
_json_decoder = json.JSONDecoder(parse_constant=_no_constant)


def _is_unicode(obj: object) -> bool:
    """True when every string (keys too) in a parsed JSON value is valid Unicode text."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def describe_validation_error(exc: ValidationError) -> str:
    """A short, client-safe summary of what was wrong with which fields."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"] if p not in {"session.config"}) or "message"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- server events


class ServerEvent(BaseModel):
    model_config = ConfigDict(frozen=True)


class SessionReady(ServerEvent):
    type: Literal["session.ready"] = "session.ready"
    session_id: str
    config: dict[str, Any]
    limits: dict[str, Any]
    capabilities: dict[str, Any]
    ignored_fields: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    resume_token: str | None = None  # send it in session.config to get this session back after a drop
    resumed: bool = False
    last_frame_id: FrameId | None = None  # resumed: the last frame the server took


class FrameAck(ServerEvent):
    type: Literal["video.frame.ack"] = "video.frame.ack"
    frame_id: FrameId | None
    pts_ms: float | None = None
    capture_ts_ms: float | None = None
    accepted: bool
    buffered_frames: int
    server_receive_ts_ms: float
    reason: Literal["filtered", "overloaded"] | None = None
    similarity: float | None = None
    dropped_frame_id: FrameId | None = None
    dropped_frame_ids: list[FrameId] = Field(default_factory=list)
    #: For codecs that show a conversation: the item the frame follows (not on the v1 wire).
    previous_item_id: str | None = Field(None, exclude=True)


class ConsumedFrame(BaseModel):
    model_config = ConfigDict(frozen=True)

    frame_id: FrameId | None
    seq: int
    pts_ms: float | None = None
    source_pts_ms: float | None = None
    capture_ts_ms: float | None = None
    server_receive_ts_ms: float
    decoded_ts_ms: float | None = None
    decode_ms: float | None = None
    timestamp_s: float


class FramesConsumed(ServerEvent):
    type: Literal["video.frames.consumed"] = "video.frames.consumed"
    request_id: str
    frame_ids: list[FrameId]  # the ids of the frames used that had one (no null)
    frames: list[ConsumedFrame]  # every frame used, named or not
    latest_pts_ms: float | None = None


class ResponseTrigger(BaseModel):
    """What started an answer that no question asked for."""

    model_config = ConfigDict(frozen=True)

    type: Literal["watch"] = "watch"
    watch_id: str


class ResponseStart(ServerEvent):
    type: Literal["response.start"] = "response.start"
    request_id: str
    trigger: ResponseTrigger | None = None
    #: The answer's output modalities: for other codecs; v1 announces them in session.ready.
    modalities: list[str] = Field(default_factory=lambda: ["text"], exclude=True)
    #: For other codecs: the conversation item the answer becomes, and the client's metadata.
    item_id: str | None = Field(None, exclude=True)
    metadata: dict[str, str] | None = Field(None, exclude=True)
    in_conversation: bool = Field(True, exclude=True)  # false: out of band, it joins no conversation
    previous_item_id: str | None = Field(None, exclude=True)  # the item the answer's item follows


class ResponseTextDelta(ServerEvent):
    type: Literal["response.text.delta"] = "response.text.delta"
    request_id: str
    delta: str


class ResponseTextDone(ServerEvent):
    type: Literal["response.text.done"] = "response.text.done"
    request_id: str
    text: str


class ResponseAudioDelta(ServerEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    request_id: str
    data: str
    format: Literal["wav"] = "wav"


class ResponseAudioDone(ServerEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"
    request_id: str


class UsageInfo(BaseModel):
    """An answer's tokens. ``text_tokens`` + ``image_tokens`` + ``audio_tokens`` ==
    ``prompt_tokens`` (audio: the transcribed words of the question; see protocol.md)."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text_tokens(self) -> int:
        """The prompt tokens that are neither image nor audio tokens."""
        return max(0, self.prompt_tokens - self.image_tokens - self.audio_tokens)


class Timings(BaseModel):
    model_config = ConfigDict(frozen=True)

    ttft_ms: float | None = None
    first_audio_ms: float | None = None
    total_ms: float


class ResponseDone(ServerEvent):
    type: Literal["response.done"] = "response.done"
    request_id: str
    status: Literal["completed", "interrupted", "failed"]
    finish_reason: str | None = None
    usage: UsageInfo = Field(default_factory=UsageInfo)
    timings: Timings
    trigger: ResponseTrigger | None = None
    #: ``interrupted``: what stopped it; ``failed``: the code of the error sent for it.
    interrupted_by: Literal["cancel", "question", "speech", "session_end"] | None = None
    error_code: str | None = None


class WatchCreated(ServerEvent):
    """A watch as the server runs it (every field effective), and the tokens one check adds
    to the warm prefix."""

    type: Literal["watch.created"] = "watch.created"
    watch: dict[str, Any]
    tokens_per_check: int | None = None


class WatchUpdated(ServerEvent):
    type: Literal["watch.updated"] = "watch.updated"
    watch: dict[str, Any]


class WatchDeleted(ServerEvent):
    type: Literal["watch.deleted"] = "watch.deleted"
    watch_id: str


class WatchCheck(ServerEvent):
    """One check of a watch (sent only with ``report_checks``)."""

    type: Literal["watch.check"] = "watch.check"
    watch_id: str
    frame_id: FrameId | None = None
    probability: float
    ms: float


class WatchFired(ServerEvent):
    """A watch fired on the frame ``frame_id``; its answer follows (``response.start`` with
    its ``trigger``). ``decision_ms``: from that frame's receipt to this event."""

    type: Literal["watch.fired"] = "watch.fired"
    watch_id: str
    frame_id: FrameId | None = None
    pts_ms: float | None = None
    probability: float
    decision_ms: float | None = None


class WatchCleared(ServerEvent):
    """An alert's condition is no longer true: it is armed again."""

    type: Literal["watch.cleared"] = "watch.cleared"
    watch_id: str
    frame_id: FrameId | None = None
    probability: float


class InputAudioSpeechStarted(ServerEvent):
    """Server turn detection heard speech start (ms since the session's first audio sample)."""

    type: Literal["input_audio.speech_started"] = "input_audio.speech_started"
    audio_start_ms: float
    item_id: str | None = Field(None, exclude=True)  # the core's id for this speech (not on the v1 wire)


class InputAudioSpeechStopped(ServerEvent):
    """Server turn detection heard speech stop; an answer to it starts next."""

    type: Literal["input_audio.speech_stopped"] = "input_audio.speech_stopped"
    audio_start_ms: float
    audio_end_ms: float
    item_id: str | None = Field(None, exclude=True)  # the core's id for this speech (not on the v1 wire)
    previous_item_id: str | None = Field(None, exclude=True)  # the item the speech's item follows


class InputAudioTranscript(ServerEvent):
    """A spoken question as text (for engines that take no audio); the answer uses it."""

    type: Literal["input_audio.transcript"] = "input_audio.transcript"
    request_id: str
    transcript: str
    audio_ms: float


class SessionDone(ServerEvent):
    type: Literal["session.done"] = "session.done"


class SessionClosing(ServerEvent):
    """The server is shutting down: the running answer may finish; the connection closes with
    1012 within ``deadline_ms`` (reconnect, to another server when there is one)."""

    type: Literal["session.closing"] = "session.closing"
    deadline_ms: int
    reason: Literal["server_shutdown"] = "server_shutdown"


class ErrorEvent(ServerEvent):
    type: Literal["error"] = "error"
    code: str
    message: str
    frame_id: FrameId | None = None
    closes_session: bool = False
    retry_after_ms: int | None = None  # ``rate_limited``: wait this long before sending control again
    #: For other codecs: the client event the error answers (its id and wire type).
    origin: Origin | None = Field(None, exclude=True)
    wire_code: str | None = Field(None, exclude=True)  # that codec's own code for it, when it has one


class Pong(ServerEvent):
    type: Literal["pong"] = "pong"


def origin_of(event: object) -> Origin | None:
    """The wire event a client event or core command was decoded from (None for v1's own)."""
    return getattr(event, "_origin", None)


def encode(event: ServerEvent) -> str:
    """Serialise a server event to the JSON text sent on the socket."""
    return event.model_dump_json(exclude_none=False)


AnyServerEvent = Annotated[
    SessionReady
    | FrameAck
    | FramesConsumed
    | ResponseStart
    | ResponseTextDelta
    | ResponseTextDone
    | ResponseAudioDelta
    | ResponseAudioDone
    | ResponseDone
    | InputAudioSpeechStarted
    | InputAudioSpeechStopped
    | InputAudioTranscript
    | SessionDone
    | SessionClosing
    | ErrorEvent
    | Pong
    | WatchCreated
    | WatchUpdated
    | WatchDeleted
    | WatchCheck
    | WatchFired
    | WatchCleared,
    Field(discriminator="type"),
]
_server_event = TypeAdapter(AnyServerEvent)
SERVER_TYPES = frozenset(cls.model_fields["type"].default for cls in get_args(get_args(AnyServerEvent)[0]))


def parse_server_event(raw: str | bytes) -> AnyServerEvent:
    """Parse one message from the server (the client side of protocol v1).

    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) when it is not JSON or not
    a server event of this protocol.
    """
    return _server_event.validate_json(raw)
