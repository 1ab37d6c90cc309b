"""OpenAI Realtime's server events (and the parts they hold), serialised by
``encode_realtime``. ``handlers/realtime/events.py`` lists the whole protocol.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.realtime.client_events import AudioFormat, Modality

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

    @model_validator(mode="before")
    @classmethod
    def _audio_has_a_transcript(cls, data: Any) -> Any:
        """An ``input_audio`` part always says its transcript ("" until it is known): OpenAI's
        Agents SDK requires the field (None fields are left out on the wire)."""
        if isinstance(data, dict) and data.get("type") == "input_audio" and data.get("transcript") is None:
            return {**data, "transcript": ""}
        return data


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


class LivesightMemoryProgress(RealtimeServerEvent):
    """livesight's ``memory.progress`` (protocol.md) on this endpoint."""

    type: Literal["livesight.memory.progress"] = "livesight.memory.progress"
    search_id: str | None = None
    checked: int
    total: int


class LivesightMemoryResults(RealtimeServerEvent):
    """livesight's ``memory.results`` (protocol.md) on this endpoint."""

    type: Literal["livesight.memory.results"] = "livesight.memory.results"
    search_id: str | None = None
    results: list[dict[str, Any]]
    checked: int = 0
    skipped: int = 0


class LivesightMemoryCleared(RealtimeServerEvent):
    type: Literal["livesight.memory.cleared"] = "livesight.memory.cleared"
    deleted: int


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

