"""Core commands and core events that no v1 message carries.

The session core is driven by client events and answers with server events. Protocol v1
(``protocol.py``) names most of them; the commands here are what other wire protocols need
on top (a codec turns their messages into these; see ``codec.py``):

Commands (codec -> core):

    ConfigUpdate    change the session's configuration after it started (any
                    ``session.config`` field except ``model`` and ``prefix_warmup``)
    UserInput       a conversation item: user text and/or audio for the next answer, or
                    system text that joins the instructions
    CommitAudio     the buffered microphone audio becomes an item of the next answer
    ClearAudio      drop the buffered, uncommitted audio
    DeleteItem      take an item (an input, or a buffered frame by its id) out
    RetrieveItem    describe an item
    AnswerRequest   answer now, over the items so far, with optional per-answer
                    instructions, modalities and token limit

Events (core -> codec):

    ConfigUpdated, InputAdded, AudioCommitted, AudioCleared, ItemDeleted, ItemRetrieved,
    InputTranscribed (a spoken turn kept for the next answer, as words)

``SessionCore.apply`` carries out every command but ``AnswerRequest`` (which starts an
answer, as ``video.query`` does) and returns the events to send.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from handlers.wire.protocol import ServerEvent

Role = Literal["user", "system"]


class Command(BaseModel):
    """A core command that no v1 message carries."""

    model_config = ConfigDict(frozen=True)


class ConfigUpdate(Command):
    """``changes``: ``session.config`` fields to set (validated as a whole config)."""

    type: Literal["core.config_update"] = "core.config_update"
    changes: dict[str, Any]


class UserInput(Command):
    """One conversation item. ``audio``: base64 PCM16 at 16 kHz (user items only)."""

    type: Literal["core.user_input"] = "core.user_input"
    item_id: str
    role: Role = "user"
    text: str | None = Field(None, max_length=20_000)
    audio: str | None = None


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


class AnswerRequest(Command):
    """Answer now. ``instructions`` replace the system prompt for this answer only."""

    type: Literal["core.answer_request"] = "core.answer_request"
    instructions: str | None = Field(None, max_length=20_000)
    modalities: list[Literal["text", "audio"]] | None = None
    max_tokens: int | None = Field(None, ge=1)


# --------------------------------------------------------------------------- events


class ConfigUpdated(ServerEvent):
    """The effective configuration after a ``ConfigUpdate`` (same shape as ``session.ready``'s)."""

    type: Literal["core.config_updated"] = "core.config_updated"
    config: dict[str, Any]
    notes: list[str] = Field(default_factory=list)


class InputAdded(ServerEvent):
    type: Literal["core.input_added"] = "core.input_added"
    item_id: str
    role: Role
    text: str | None = None
    audio_ms: float | None = None


class AudioCommitted(ServerEvent):
    type: Literal["core.audio_committed"] = "core.audio_committed"
    item_id: str
    audio_ms: float


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
    """An item as the core holds it: a frame (``image`` as a data URL), or an input."""

    type: Literal["core.item_retrieved"] = "core.item_retrieved"
    item_id: str
    role: Role
    kind: Literal["image", "input"]
    text: str | None = None
    image: str | None = None
    audio_ms: float | None = None
