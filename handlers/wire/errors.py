"""livesight's error codes and the one exception type that carries them.

The session core raises ``SessionError``; the connection boundary turns each into exactly
one ``error`` event. Any other exception is a bug: it is logged with its traceback and the
client gets a generic message.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    CONFIG_TIMEOUT = "config_timeout"
    INVALID_CONFIG = "invalid_config"
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_IMAGE = "invalid_image"
    FRAME_TOO_LARGE = "frame_too_large"
    INVALID_AUDIO = "invalid_audio"
    AUDIO_OVERFLOW = "audio_overflow"
    NO_FRAMES = "no_frames"
    ITEM_NOT_FOUND = "item_not_found"
    ENGINE_ERROR = "engine_error"
    SPEECH_FAILED = "speech_failed"
    TRANSCRIPTION_FAILED = "transcription_failed"
    IDLE_TIMEOUT = "idle_timeout"
    TOO_MANY_SESSIONS = "too_many_sessions"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN_ORIGIN = "forbidden_origin"
    INTERNAL_ERROR = "internal_error"
    SERVER_CLOSING = "server_closing"
    RESUME_FAILED = "resume_failed"
    RATE_LIMITED = "rate_limited"
    INVALID_WATCH = "invalid_watch"
    MEMORY_OFF = "memory_off"
    MEMORY_BUSY = "memory_busy"
    UNKNOWN_WATCH = "unknown_watch"
    TOO_MANY_WATCHES = "too_many_watches"
    TOO_MANY_MESSAGES = "too_many_messages"
    STREAM_NOT_FOUND = "stream_not_found"
    DUPLICATE_ITEM_ID = "duplicate_item_id"
    INVALID_TRUNCATE = "invalid_truncate"
    #: OpenAI Realtime's own codes, which its clients act on (one answer at a time).
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = "conversation_already_has_active_response"
    RESPONSE_CANCEL_NOT_ACTIVE = "response_cancel_not_active"


#: Codes after which the server closes the connection.
CLOSING_CODES = frozenset(
    {
        ErrorCode.CONFIG_TIMEOUT,
        ErrorCode.INVALID_CONFIG,
        ErrorCode.IDLE_TIMEOUT,
        ErrorCode.TOO_MANY_SESSIONS,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN_ORIGIN,
        ErrorCode.SERVER_CLOSING,
        ErrorCode.TOO_MANY_MESSAGES,
        ErrorCode.STREAM_NOT_FOUND,
    }
)

#: WebSocket close codes used with the closing errors.
CLOSE_CODES = {
    ErrorCode.CONFIG_TIMEOUT: 1008,
    ErrorCode.INVALID_CONFIG: 1008,
    ErrorCode.IDLE_TIMEOUT: 1000,
    ErrorCode.TOO_MANY_SESSIONS: 1013,
    ErrorCode.UNAUTHORIZED: 1008,
    ErrorCode.FORBIDDEN_ORIGIN: 1008,
    ErrorCode.SERVER_CLOSING: 1012,  # service restart: clients reconnect (elsewhere)
    ErrorCode.TOO_MANY_MESSAGES: 1008,  # policy: clients that reconnect by themselves do not on 1008
    ErrorCode.STREAM_NOT_FOUND: 1008,
}


@dataclass(frozen=True, slots=True)
class Origin:
    """The client event a command or an error comes from: its ``event_id`` (None when the
    client gave none) and its wire ``type``."""

    event_id: str | None
    event_type: str


class SessionError(Exception):
    """A problem the client should hear about, with a stable code and a safe message."""

    def __init__(
        self, code: ErrorCode, message: str, *, frame_id: str | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.frame_id = frame_id
        self.retry_after_ms = retry_after_ms  # ``rate_limited``: when the client may send again
        self.origin: Origin | None = None  # the client event it answers (set where the event is known)
        self.wire_code: str | None = None  # a codec's own code for it, set by the codec that parsed the event

    @property
    def closes_session(self) -> bool:
        """True when the session ends after this error is sent."""
        return self.code in CLOSING_CODES
