"""The conversation's items as a client edits them: create anywhere, delete, retrieve, truncate.

A Realtime client sees one conversation of items; the core holds them in several places, and
this module keeps them one conversation:

- frames (the buffer; a frame id is the item's id);
- pending inputs: user text and audio waiting for the next answer (``SessionCore.inputs``);
- system items: text that joins the instructions (``SessionCore.system_items``);
- messages of the timeline's closed turns: questions, answers (the item id an answer was
  given when it started) and the user and assistant messages a client put there.

An item put at the end is pending (a user's) or closes the open turn (an assistant's: the
pending inputs are its question, as when an answer ends); one put after an item of a closed
turn, or first (``previous_item_id`` ``root``), is put there in the timeline, so a seeded
history is in the prompt as it was given. A truncated answer keeps the words its listener
heard. Pure and synchronous, like the rest of the core.
"""

from __future__ import annotations

import base64
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from handlers.core.events import InputAdded, ItemDeleted, ItemRetrieved, ItemTruncated
from handlers.core.timeline import Message, heard_text
from handlers.wire.commands import ROOT, TruncateItem, UserInput
from handlers.wire.errors import ErrorCode, SessionError

from handlers.core.frames import Frame, FrameBuffer
from handlers.core.timeline import Timeline
from handlers.wire.fields import MAX_INSTRUCTIONS_CHARS, MAX_QUESTION_CHARS

#: Most text that pending inputs may hold (they make one question), and system items (they
#: join the instructions).
MAX_INPUT_CHARS = MAX_QUESTION_CHARS
MAX_SYSTEM_ITEMS_CHARS = MAX_INSTRUCTIONS_CHARS
#: How many of the newest items' ids are kept in order, to know the newest when one is deleted.
RECENT_ITEMS = 256
#: Most text the timeline's messages may hold for a client to add one (a seeded history, an
#: item put before others): beyond it, items must be deleted first.
MAX_TIMELINE_CHARS = 200_000


@dataclass
class PendingInput:
    """A conversation item waiting for the next answer: user text and/or 16 kHz PCM16 audio."""

    item_id: str
    text: str | None
    pcm16: bytes = b""
    spoken: bool = False  # the text is a transcript of speech


def _image_type(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/jpeg"


def _short(item_id: str) -> str:
    return repr(item_id[:64])


class RunningAnswer(Protocol):
    """What the items need of the answer under way (``answer.Answer``)."""

    item_id: str
    in_conversation: bool
    modalities: list[str]
    audio_pieces: list[tuple[float, str]]
    heard_ms: int | None
    deleted: bool

    @property
    def text(self) -> str: ...  # what it has said so far


class ItemHolder(Protocol):
    """What the items need of the session core that holds them (``SessionCore``)."""

    buffer: FrameBuffer
    timeline: Timeline
    inputs: list[PendingInput]
    system_items: dict[str, str]
    running: RunningAnswer | None

    @property
    def limits(self) -> object: ...  # ``max_audio_bytes``

    def pcm(self, data: str) -> bytes: ...

    def audio_ms(self, pcm16: bytes) -> float: ...

    def pending_audio_bytes(self) -> int: ...

    def close_open_turn(self, messages: list[Message]) -> None: ...


class Conversation:
    """One session's items (see the module docstring); ``tail`` is the newest item's id."""

    def __init__(self, core: ItemHolder) -> None:
        self.core = core
        self._recent: deque[str] = deque(maxlen=RECENT_ITEMS)  # the newest items' ids, oldest first

    # ------------------------------------------------------------------ lookup
    @property
    def tail(self) -> str | None:
        """The newest item's id (None: none yet, or all the recent ones were deleted)."""
        return self._recent[-1] if self._recent else None

    def appended(self, item_id: str | None) -> None:
        """An item joined at the end (a frame, an input, an answer): it is the newest."""
        if item_id is not None:
            self._recent.append(item_id)

    def _frame(self, item_id: str) -> Frame | None:
        return next((f for f in self.core.buffer.frames if f.frame_id is not None and str(f.frame_id) == item_id), None)

    def _input(self, item_id: str) -> PendingInput | None:
        return next((i for i in self.core.inputs if i.item_id == item_id), None)

    def _running(self, item_id: str) -> RunningAnswer | None:
        plan = self.core.running
        return plan if plan is not None and plan.item_id == item_id and plan.in_conversation else None

    def exists(self, item_id: str) -> bool:
        """True when the conversation holds an item ``item_id``."""
        core = self.core
        return (
            self._frame(item_id) is not None or item_id in core.system_items or self._input(item_id) is not None
            or core.timeline.find(item_id) is not None or self._running(item_id) is not None
        )

    # ------------------------------------------------------------------ create
    def add(self, item: UserInput) -> InputAdded:
        """Put an item in the conversation; returns the ``InputAdded`` to send. Raises
        ``duplicate_item_id``, ``item_not_found`` (an unknown ``previous_item_id``),
        ``invalid_message``, ``invalid_audio`` and ``audio_overflow``."""
        if self.exists(item.item_id):
            raise SessionError(ErrorCode.DUPLICATE_ITEM_ID, f"the conversation already has an item {_short(item.item_id)}")
        after = item.previous_item_id
        if after is not None and after != ROOT and not self.exists(after):
            raise SessionError(ErrorCode.ITEM_NOT_FOUND, f"no item {_short(after)} to put the item after")
        at_end = after is None or after == self.tail
        if item.role == "system":
            self._add_system(item)
        elif at_end or self._input(after or "") is not None or self._frame(after or "") is not None:
            at_end = at_end or self._input(after or "") is None
            self._add_at_end(item, after if not at_end else None)
        else:  # into the timeline, after one of its messages or frames, or first
            if item.audio:
                raise SessionError(ErrorCode.INVALID_MESSAGE, "an item put before others holds text only")
            self._check_text(item.text, 0)
            self._check_timeline(item.text)
            message = Message(item.role, item.text or "", (item.item_id,))
            if not self.core.timeline.insert(None if after == ROOT else after, message):
                raise SessionError(ErrorCode.ITEM_NOT_FOUND, f"no item {_short(after or '')} to put the item after")
        previous = (None if after == ROOT else after) if after is not None else self.tail
        if at_end:
            self.appended(item.item_id)
        audio_ms = None
        if item.role == "user" and (pending := self._input(item.item_id)) is not None and pending.pcm16:
            audio_ms = self.core.audio_ms(pending.pcm16)
        return InputAdded(item_id=item.item_id, role=item.role, text=item.text, audio_ms=audio_ms,
                          previous_item_id=previous, at_end=at_end)

    @staticmethod
    def _check_text(text: str | None, held: int) -> None:
        if held + len(text or "") > MAX_INPUT_CHARS:
            raise SessionError(ErrorCode.INVALID_MESSAGE, f"items waiting for an answer may hold {MAX_INPUT_CHARS} characters")

    def _check_timeline(self, text: str | None) -> None:
        held = sum(len(m.text) for turn in self.core.timeline.turns for m in turn.messages)
        if held + len(text or "") > MAX_TIMELINE_CHARS:
            raise SessionError(ErrorCode.INVALID_MESSAGE,
                               f"the conversation's messages may hold {MAX_TIMELINE_CHARS} characters; delete some first")

    def _add_system(self, item: UserInput) -> None:
        core = self.core
        if item.audio or not item.text:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "a system item holds text only")
        if sum(map(len, core.system_items.values())) + len(item.text) > MAX_SYSTEM_ITEMS_CHARS:
            raise SessionError(ErrorCode.INVALID_MESSAGE, f"system items may hold {MAX_SYSTEM_ITEMS_CHARS} characters")
        core.system_items[item.item_id] = item.text

    def _add_at_end(self, item: UserInput, after_input: str | None) -> None:
        """A user item waits for the next answer (after pending input ``after_input``, when
        given); an assistant item closes the open turn with the pending inputs (up to
        ``after_input``) as its question."""
        core = self.core
        if item.role == "assistant":
            if item.audio:
                raise SessionError(ErrorCode.INVALID_MESSAGE, "an assistant item holds text (or its audio's transcript)")
            self._check_text(item.text, 0)
            self._check_timeline(item.text)
            cut = len(core.inputs)
            if after_input is not None:
                cut = next(n for n, i in enumerate(core.inputs) if i.item_id == after_input) + 1
            asked = [i for i in core.inputs[:cut] if i.text]  # spoken inputs not yet in words stay pending
            core.inputs = [i for i in core.inputs if i not in asked]
            core.close_open_turn([
                *(Message("user", i.text or "", (i.item_id,)) for i in asked),
                Message("assistant", item.text or "", (item.item_id,)),
            ])
            return
        pcm = core.pcm(item.audio) if item.audio else b""
        if not pcm and not item.text:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "a user item needs text, audio or an image")
        self._check_text(item.text, sum(len(i.text or "") for i in core.inputs))
        if core.pending_audio_bytes() + len(pcm) > core.limits.max_audio_bytes:
            raise SessionError(ErrorCode.AUDIO_OVERFLOW, f"pending audio would exceed {core.limits.max_audio_bytes} bytes")
        pending = PendingInput(item.item_id, item.text, pcm)
        if after_input is None:
            core.inputs.append(pending)
        else:
            n = next(n for n, i in enumerate(core.inputs) if i.item_id == after_input)
            core.inputs.insert(n + 1, pending)

    # ------------------------------------------------------------------ delete, retrieve
    def delete(self, item_id: str) -> ItemDeleted:
        """Take an item out (the running answer's: it will not join the timeline). Raises
        ``item_not_found``."""
        core = self.core
        frame = self._frame(item_id)
        plan = self._running(item_id)
        if frame is not None:
            core.buffer.remove(frame)  # a running answer or warmup keeps it until it ends (pinned)
        elif item_id in core.system_items:
            del core.system_items[item_id]
        elif self._input(item_id) is not None:
            core.inputs = [i for i in core.inputs if i.item_id != item_id]
        elif plan is not None:
            plan.deleted = True
        elif not core.timeline.remove(item_id):
            raise SessionError(ErrorCode.ITEM_NOT_FOUND, f"no item {_short(item_id)} in the conversation")
        if item_id in self._recent:
            self._recent.remove(item_id)  # the one before it is the newest again
        return ItemDeleted(item_id=item_id)

    def retrieve(self, item_id: str) -> ItemRetrieved:
        """Describe an item. Raises ``item_not_found``."""
        core = self.core
        frame = self._frame(item_id)
        if frame is not None and frame.data:
            url = f"data:{_image_type(frame.data)};base64,{base64.b64encode(frame.data).decode('ascii')}"
            return ItemRetrieved(item_id=item_id, role="user", kind="image", image=url)
        if item_id in core.system_items:
            return ItemRetrieved(item_id=item_id, role="system", kind="input", text=core.system_items[item_id])
        if (pending := self._input(item_id)) is not None:
            audio_ms = core.audio_ms(pending.pcm16) if pending.pcm16 else None
            return ItemRetrieved(item_id=item_id, role="user", kind="input", text=pending.text, audio_ms=audio_ms)
        if (plan := self._running(item_id)) is not None:
            return ItemRetrieved(item_id=item_id, role="assistant", kind="message", text=plan.text,
                                 audio_ms=plan.audio_pieces[-1][0] if plan.audio_pieces else None)
        found = core.timeline.find(item_id)
        if found is None:
            raise SessionError(ErrorCode.ITEM_NOT_FOUND, f"no item {_short(item_id)} in the conversation")
        message = found[0].messages[found[1]]
        role = "assistant" if message.role == "assistant" else "user"
        return ItemRetrieved(item_id=item_id, role=role, kind="message", text=message.text, audio_ms=message.audio_ms)

    # ------------------------------------------------------------------ truncate
    def truncate(self, command: TruncateItem) -> ItemTruncated:
        """Cut a spoken answer to its first ``audio_end_ms`` (the running one when it ends);
        a cut past its end keeps it whole. Raises ``item_not_found`` and ``invalid_truncate``."""
        core = self.core
        event = ItemTruncated(item_id=command.item_id, content_index=command.content_index,
                              audio_end_ms=command.audio_end_ms)
        if command.content_index != 0:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "an answer has one content part: content_index must be 0")
        if (plan := self._running(command.item_id)) is not None:
            if "audio" not in plan.modalities:
                raise SessionError(ErrorCode.INVALID_TRUNCATE, "only an answer with audio can be truncated")
            plan.heard_ms = command.audio_end_ms
            return event
        found = core.timeline.find(command.item_id)
        if found is None:
            raise SessionError(ErrorCode.ITEM_NOT_FOUND, f"no item {_short(command.item_id)} in the conversation")
        message = found[0].messages[found[1]]
        if message.role != "assistant" or not message.spoken:
            raise SessionError(ErrorCode.INVALID_TRUNCATE, "only an answer with audio can be truncated")
        heard = heard_text(message, command.audio_end_ms)
        if heard != message.text:
            spoken = tuple(p for p in message.spoken if p[0] <= command.audio_end_ms)
            core.timeline.replace(command.item_id, Message("assistant", heard, message.item_ids,
                                                           (*spoken, (float(command.audio_end_ms), ""))))
        return event
