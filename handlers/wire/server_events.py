"""Protocol v1's server events (the messages the server sends), how they are serialised,
and how a client reads them back (``parse_server_event``). ``handlers/wire/protocol.py``
lists the whole protocol.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, computed_field

from handlers.wire.fields import FrameId


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
    memory_id: str | None = None  # the session's memory: its own id, or the earlier session's it continues


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


class MemoryProgress(ServerEvent):
    """A ``memory.search`` with a condition: ``checked`` of ``total`` moments so far."""

    type: Literal["memory.progress"] = "memory.progress"
    search_id: str | None = None
    checked: int
    total: int


class MemoryResult(BaseModel):
    """One remembered moment a search found: its span (wall clock, ms), the condition's
    probability on its keyframe or the text that matched, its caption, and its keyframe."""

    moment_id: int
    start_ms: float
    end_ms: float
    probability: float | None = None
    match: str | None = None
    kind: str | None = None
    caption: str | None = None
    url: str


class MemoryResults(ServerEvent):
    """What a ``memory.search`` found, best first (by probability, else newest first)."""

    type: Literal["memory.results"] = "memory.results"
    search_id: str | None = None
    results: list[MemoryResult]
    checked: int = 0
    skipped: int = 0


class MemoryCleared(ServerEvent):
    """``memory.clear`` done: ``deleted`` records are gone from the store."""

    type: Literal["memory.cleared"] = "memory.cleared"
    deleted: int


class InputAudioSpeechStarted(ServerEvent):
    """Server turn detection heard speech start (ms since the session's first audio sample)."""

    type: Literal["input_audio.speech_started"] = "input_audio.speech_started"
    audio_start_ms: float


class InputAudioSpeechStopped(ServerEvent):
    """Server turn detection heard speech stop; an answer to it starts next."""

    type: Literal["input_audio.speech_stopped"] = "input_audio.speech_stopped"
    audio_start_ms: float
    audio_end_ms: float


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


class Pong(ServerEvent):
    type: Literal["pong"] = "pong"


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
    | WatchCleared
    | MemoryProgress
    | MemoryResults
    | MemoryCleared,
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

