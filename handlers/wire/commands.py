"""Core commands and core events that no v1 message carries.

The session core is driven by client events and answers with server events. Protocol v1
(``protocol.py``) names most of them; the commands here are what other wire protocols need
on top (a codec turns their messages into these; see ``codec.py``):

Commands (codec -> core):

    ConfigUpdate    change the session's configuration after it started (any
                    ``session.config`` field except ``model`` and ``prefix_warmup``), with
                    the parts of the client's update the codec could not read (``refused``)
    UserInput       a conversation item: user text and/or audio for the next answer, an
                    assistant message (a turn of the conversation as the client had it), or
                    system text that joins the instructions; after ``previous_item_id``
    CommitAudio     the buffered microphone audio becomes an item of the next answer
    ClearAudio      drop the buffered, uncommitted audio
    DeleteItem      take an item (an input, a message, an answer, a frame) out
    RetrieveItem    describe an item
    TruncateItem    cut an answer to what the client played of its audio
    ClearOutputAudio  stop sending the running answer's audio
    AnswerRequest   answer now, over the items so far (or over ``input`` only), with
                    optional per-answer instructions, modalities, token limit and metadata
    CancelRequest   stop the running answer; an error when none runs

Events (core -> codec):

    ConfigUpdated, InputAdded, AudioCommitted, AudioCleared, ItemDeleted, ItemRetrieved,
    ItemTruncated, OutputAudioCleared, IdleTimeout (an answer starts after a silence),
    InputTranscribed (a spoken turn kept for the next answer, as words)

``SessionCore.apply`` carries out every command but ``AnswerRequest`` (which starts an
answer, as ``video.query`` does) and ``CancelRequest`` (the adapter's) and returns the
events to send. A command carries the wire event it came from (``origin_of``), so an error
it causes names that event.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from handlers.wire.errors import Origin
from handlers.wire.fields import MAX_INSTRUCTIONS_CHARS, MAX_ITEM_TEXT_CHARS
from handlers.wire.server_events import ServerEvent

Role = Literal["user", "system", "assistant"]
#: ``previous_item_id`` that puts an item first in the conversation.
ROOT = "root"


class Command(BaseModel):
    """A core command that no v1 message carries."""

    model_config = ConfigDict(frozen=True)

    _origin: Origin | None = PrivateAttr(None)


def from_wire(event: BaseModel, origin: Origin) -> BaseModel:
    """``event`` (a command or a v1 client event a codec made) marked as coming from ``origin``."""
    event._origin = origin  # type: ignore[attr-defined]
    return event


class ConfigUpdate(Command):
    """``changes``: ``session.config`` fields to set (each one that is invalid is refused
    alone); ``refused``: what the codec could not read, said back as one error."""

    type: Literal["core.config_update"] = "core.config_update"
    changes: dict[str, Any]
    refused: list[str] = Field(default_factory=list)
    ignored: list[str] = Field(default_factory=list)  # what the client sent that the server does not know


class UserInput(Command):
    """One conversation item. ``audio``: base64 PCM16 at 16 kHz (user items only); an
    assistant item's ``text`` is its text or its audio's transcript. ``previous_item_id``:
    the item it follows (None: the end; ``ROOT``: the start)."""

    type: Literal["core.user_input"] = "core.user_input"
    item_id: str
    role: Role = "user"
    text: str | None = Field(None, max_length=MAX_ITEM_TEXT_CHARS)
    audio: str | None = None
    previous_item_id: str | None = Field(None, max_length=256)


class CommitAudio(Command):
    type: Literal["core.commit_audio"] = "core.commit_audio"
    item_id: str


class ClearAudio(Command):
    type: Literal["core.clear_audio"] = "core.clear_audio"


class DeleteItem(Command):
    type: Literal["core.delete_item"] = "core.delete_item"
    item_id: str


class RetrieveItem(Command):
    type: Literal["core.retrieve_item"] = "core.retrieve_item"
    item_id: str


class TruncateItem(Command):
    """Cut answer ``item_id`` to its first ``audio_end_ms`` of audio (what the client played)."""

    type: Literal["core.truncate_item"] = "core.truncate_item"
    item_id: str
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0)


class ClearOutputAudio(Command):
    type: Literal["core.clear_output_audio"] = "core.clear_output_audio"


class InputMessage(BaseModel):
    """A message of an answer's own ``input``: given inline, or a conversation item's id."""

    model_config = ConfigDict(frozen=True)

    role: Role = "user"
    text: str | None = Field(None, max_length=MAX_ITEM_TEXT_CHARS)
    item_id: str | None = Field(None, max_length=256)  # a reference: the item's content


class AnswerRequest(Command):
    """Answer now. ``instructions`` replace the system prompt for this answer only.

    ``exclusive``: refused while an answer runs (else it interrupts it, as ``video.query``);
    ``in_conversation`` false: answered over the conversation, but neither uses up its
    pending inputs nor joins it; ``input``: the answer's whole context instead of the
    conversation (its text messages; the frames it names, else the buffered ones);
    ``metadata``: echoed with the answer."""

    type: Literal["core.answer_request"] = "core.answer_request"
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    modalities: list[Literal["text", "audio"]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    exclusive: bool = False
    in_conversation: bool = True
    input: list[InputMessage] | None = Field(None, max_length=64)
    metadata: dict[str, str] | None = None


class CancelRequest(Command):
    """Stop the running answer; ``response_cancel_not_active`` when none runs."""

    type: Literal["core.cancel_request"] = "core.cancel_request"


# --------------------------------------------------------------------------- events


class ConfigUpdated(ServerEvent):
    """The effective configuration after a ``ConfigUpdate`` (same shape as ``session.ready``'s)."""

    type: Literal["core.config_updated"] = "core.config_updated"
    config: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)  # parts of the update not applied, and why
    ignored: list[str] = Field(default_factory=list)  # the update's fields the server does not know


class InputAdded(ServerEvent):
    """An item joined the conversation after ``previous_item_id`` (None: first); ``at_end``:
    it is the conversation's newest item (else it was put before others)."""

    type: Literal["core.input_added"] = "core.input_added"
    item_id: str
    role: Role
    text: str | None = None
    audio_ms: float | None = None
    previous_item_id: str | None = None
    at_end: bool = True


class AudioCommitted(ServerEvent):
    type: Literal["core.audio_committed"] = "core.audio_committed"
    item_id: str
    audio_ms: float
    previous_item_id: str | None = None


class InputTranscribed(ServerEvent):
    """A spoken turn that waits for the next answer (turn detection with ``create_response``
    off, or speech over an answer it may not interrupt) was transcribed: the words replace its
    audio. ``item_id`` is the speech's (``input_audio.speech_started``'s ``item_id``)."""

    type: Literal["core.input_transcribed"] = "core.input_transcribed"
    item_id: str
    transcript: str
    audio_ms: float


class AudioCleared(ServerEvent):
    type: Literal["core.audio_cleared"] = "core.audio_cleared"


class ItemDeleted(ServerEvent):
    type: Literal["core.item_deleted"] = "core.item_deleted"
    item_id: str


class ItemRetrieved(ServerEvent):
    """An item as the core holds it: a frame (``image`` as a data URL), an input, or a
    message of the conversation (an assistant's: ``text``, and ``audio_ms`` when spoken)."""

    type: Literal["core.item_retrieved"] = "core.item_retrieved"
    item_id: str
    role: Role
    kind: Literal["image", "input", "message"]
    text: str | None = None
    image: str | None = None
    audio_ms: float | None = None


class ItemTruncated(ServerEvent):
    type: Literal["core.item_truncated"] = "core.item_truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class IdleTimeout(ServerEvent):
    """Nobody spoke for ``turn_detection.idle_timeout_ms`` after an answer: an answer starts by
    itself. ``audio_start_ms`` / ``audio_end_ms``: the silent stretch of the microphone stream."""

    type: Literal["core.idle_timeout"] = "core.idle_timeout"
    item_id: str
    audio_start_ms: float
    audio_end_ms: float


class OutputAudioCleared(ServerEvent):
    type: Literal["core.output_audio_cleared"] = "core.output_audio_cleared"
