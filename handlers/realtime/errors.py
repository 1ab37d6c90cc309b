"""livesight's errors as Realtime ``error`` events: OpenAI's code where it has one for the
problem, else livesight's; ``server_error`` for the server's faults, ``invalid_request_error``
for the client's; the ``event_id`` of the client event that caused it."""

from __future__ import annotations

from handlers.core.events import ErrorReported
from handlers.realtime import server_events as rt
from handlers.wire.errors import ErrorCode

#: The core's errors that are the server's fault, not the client's.
SERVER_ERRORS = frozenset(
    {ErrorCode.ENGINE_ERROR, ErrorCode.INTERNAL_ERROR, ErrorCode.SPEECH_FAILED, ErrorCode.TRANSCRIPTION_FAILED}
)
#: OpenAI's code for a livesight error, by the client event that caused it (None: any event).
OPENAI_CODES: dict[tuple[str, str | None], str] = {
    (ErrorCode.UNKNOWN_TYPE, None): "invalid_value",
    (ErrorCode.INVALID_MESSAGE, None): "invalid_value",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.retrieve"): "item_retrieve_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.delete"): "item_delete_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.truncate"): "item_truncate_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.create"): "item_create_invalid_previous_item_id",
    (ErrorCode.DUPLICATE_ITEM_ID, None): "item_create_duplicate_item_id",
    (ErrorCode.INVALID_TRUNCATE, None): "unsupported_content_type",
    (ErrorCode.INVALID_AUDIO, "input_audio_buffer.commit"): "input_audio_buffer_commit_empty",
}


def openai_code(code: str, event_type: str | None) -> str:
    """The code an error gets on /v1/realtime: OpenAI's where it has one, else livesight's."""
    return OPENAI_CODES.get((code, event_type)) or OPENAI_CODES.get((code, None)) or code


def realtime_error(event: ErrorReported, event_id: str) -> rt.RealtimeError:
    """The core's ``error`` as a Realtime ``error`` event with id ``event_id``."""
    origin = event.origin
    server_side = event.code in SERVER_ERRORS
    code = event.wire_code or openai_code(event.code, origin.event_type if origin else None)
    return rt.RealtimeError(
        event_id=event_id,
        error=rt.ErrorDetail(
            type="server_error" if server_side else "invalid_request_error",
            code=code, message=event.message, event_id=origin.event_id if origin else None,
        ),
    )
