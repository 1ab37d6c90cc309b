"""Conversation items both ways: a client's ``conversation.item.create`` and ``response.create``
as the core's inputs, and the core's items as Realtime ``Item`` objects.

A camera frame is a user item with one ``input_image``; an item's images are frames (each
named after the item), its text and audio one input of the conversation; an assistant item
is a turn of the conversation as the client had it, a system item text that joins the
instructions.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

from handlers.core.events import ItemRetrieved
from handlers.realtime import client_events as rtc
from handlers.realtime import server_events as rt
from handlers.realtime.audio import audio_in
from handlers.realtime.session_view import core_modalities, max_tokens
from handlers.wire.client_events import VideoFrame
from handlers.wire.codec import CoreInput
from handlers.wire.commands import AnswerRequest, InputMessage, UserInput
from handlers.wire.errors import ErrorCode, SessionError

_TEXT_PARTS = frozenset({"input_text", "text", "output_text"})


def item_inputs(
    item: rtc.MessageItem, previous_item_id: str | None, in_format: str, new_item_id: Callable[[], str]
) -> list[CoreInput]:
    """``conversation.item.create``'s item as the core's inputs (its audio in ``in_format``;
    ``new_item_id`` names an item the client left unnamed). Raises ``SessionError``."""
    item_id = item.id or new_item_id()
    texts = [part.text for part in item.content if part.type in _TEXT_PARTS and part.text]
    images = [part for part in item.content if part.type == "input_image"]
    audios = [part for part in item.content if part.type == "input_audio"]
    if item.role == "assistant":
        spoken = [p.transcript for p in item.content if p.type in {"output_audio", "audio"} and p.transcript]
        if images or audios:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "an assistant item holds text or audio with its transcript")
        return [UserInput(item_id=item_id, role="assistant", text="\n".join(texts + spoken),
                          previous_item_id=previous_item_id)]
    if item.role == "system":
        if images or audios:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "a system item holds input_text only")
        return [UserInput(item_id=item_id, role="system", text="\n".join(texts), previous_item_id=previous_item_id)]
    out: list[CoreInput] = []
    for n, part in enumerate(images):
        if not part.image_url or not part.image_url.startswith("data:"):
            raise SessionError(ErrorCode.INVALID_IMAGE, "input_image needs image_url as a data URL (data:image/jpeg;base64,...)")
        alone = len(images) == 1 and not texts and not audios
        out.append(VideoFrame(type="video.frame", data=part.image_url, frame_id=item_id if alone else f"{item_id}.{n}",
                              detail=part.detail))
    pcm = b""
    for part in audios:
        if not part.audio:
            raise SessionError(ErrorCode.INVALID_AUDIO, "input_audio needs audio")
    if audios:
        pcm = b"".join(base64.b64decode(audio_in(part.audio or "", in_format)) for part in audios)
    if texts or pcm:
        audio = base64.b64encode(pcm).decode("ascii") if pcm else None
        out.append(UserInput(item_id=item_id, text="\n".join(texts) or None, audio=audio,
                             previous_item_id=previous_item_id))
    return out


def answer_request(response: rtc.ResponseParams) -> AnswerRequest:
    """``response.create``'s parameters as the core's request for an answer. Raises
    ``SessionError`` for an ``input`` message holding an image or audio."""
    context = None
    if response.input is not None:
        context = []
        for part in response.input:
            if isinstance(part, rtc.ItemReference):
                context.append(InputMessage(item_id=part.id))
                continue
            if any(p.type in {"input_image", "input_audio"} for p in part.content):
                raise SessionError(ErrorCode.INVALID_MESSAGE, "response.input takes images and audio only as "
                                   "item_reference to conversation items")
            text = "\n".join(p.text or p.transcript or "" for p in part.content).strip()
            context.append(InputMessage(role=part.role, text=text or None))
    return AnswerRequest(
        instructions=response.instructions,
        modalities=core_modalities(response.output_modalities) if response.output_modalities else None,
        max_tokens=max_tokens(response.max_output_tokens) if response.max_output_tokens is not None else None,
        exclusive=True, in_conversation=response.conversation != "none", input=context,
        metadata=response.metadata, range=response.livesight.range if response.livesight is not None else None,
    )


def audio_item(item_id: str) -> rt.Item:
    """A user item of audio (a commit, or speech that turn detection ended)."""
    return rt.Item(id=item_id, role="user", content=[rt.ItemContent(type="input_audio")])


def retrieved_item(event: ItemRetrieved) -> rt.Item:
    """An item as the core holds it, for ``conversation.item.retrieved``."""
    if event.role == "assistant":
        kind = "output_audio" if event.audio_ms is not None else "output_text"
        part = rt.ItemContent(type=kind, transcript=event.text or "") if kind == "output_audio" else \
            rt.ItemContent(type=kind, text=event.text or "")
        return rt.Item(id=event.item_id, role="assistant", content=[part])
    content = []
    if event.image is not None:
        content.append(rt.ItemContent(type="input_image", image_url=event.image))
    if event.text:
        content.append(rt.ItemContent(type="input_text", text=event.text))
    if event.audio_ms is not None:
        content.append(rt.ItemContent(type="input_audio"))
    return rt.Item(id=event.item_id, role=event.role, content=content)
