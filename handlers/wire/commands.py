"""Core commands that no v1 message carries.

The session core is driven by client events and answers with its own events
(``handlers/core/events.py``). Protocol v1 (``protocol.py``) names most of the client
events; the commands here are what other wire protocols need on top (a codec turns their
messages into these; see ``codec.py``):

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

What the core says back to them (``ConfigUpdated``, ``InputAdded``, ``ItemTruncated``, ...)
is in its own vocabulary, ``handlers/core/events.py``.

``SessionCore.apply`` carries out every command but ``AnswerRequest`` (which starts an
answer, as ``video.query`` does) and ``CancelRequest`` (the adapter's) and returns the
events to send. A command carries the wire event it came from (``origin_of``), so an error
it causes names that event.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from handlers.wire.client_events import TimeRange
from handlers.wire.errors import Origin
from handlers.wire.fields import MAX_INSTRUCTIONS_CHARS, MAX_ITEM_TEXT_CHARS

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
    ``metadata``: echoed with the answer; ``range``: about the past, as ``video.query``'s
    (the question is the input's, or the pending inputs', text; out of the conversation)."""

    type: Literal["core.answer_request"] = "core.answer_request"
    instructions: str | None = Field(None, max_length=MAX_INSTRUCTIONS_CHARS)
    modalities: list[Literal["text", "audio"]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    exclusive: bool = False
    in_conversation: bool = True
    input: list[InputMessage] | None = Field(None, max_length=64)
    metadata: dict[str, str] | None = None
    range: TimeRange | None = None


class CancelRequest(Command):
    """Stop the running answer; ``response_cancel_not_active`` when none runs."""

    type: Literal["core.cancel_request"] = "core.cancel_request"
