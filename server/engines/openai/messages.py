"""Chat completion request bodies: a ``Prompt`` as OpenAI chat messages.

Frames travel as data URLs of the client's own bytes, so nothing is re-encoded (a frame held
without them is JPEG-encoded once), and each carries its content key as the part's ``uuid``,
which vLLM takes as the image's cache identity. An image the replica already holds goes by
``uuid`` alone (``"image_url": null``): vLLM serves it from its multimodal cache without
receiving, decoding or processing it again, which is what keeps a warm request over a window
of frames small. The body records which images went with data and how many by reference,
because only the former may be remembered as held once the replica accepts the request.

User text is escaped: the remote server's tokenizer is not known here, so anything that could
open a special token is broken up rather than matched against one tokenizer's list.
"""

from __future__ import annotations

import base64
import io
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import anyio
from PIL import Image

from server.engines.base import ImageSegment, Prompt, Sampling, TextSegment
from server.engines.openai.replicas import Replica

_DATA_URL_CACHE = 512  # frames whose data URL is kept

# What opens a special token's text in the chat formats seen (``<|im_end|>``, ``<|eot_id|>``,
# ``<image>``, ``</s>``, ``<end_of_utterance>``): a remote server's tokenizer is not known here.
_MARKUP_START = re.compile(r"<(?=[|/A-Za-z_])")


@dataclass
class Body:
    """A request body and how its images travel: keys sent with data, and images named only."""

    json: dict[str, Any]
    sent: list[str]
    referenced: int


class DataUrls:
    """Data URLs of recent frames by content key, so a frame that goes with its data in many
    requests (each one over its window, to a server that takes no uuid-only images; a resend
    after a cache miss; the first request to each replica) is base64-encoded once."""

    def __init__(self, size: int = _DATA_URL_CACHE) -> None:
        self.size = size
        self._urls: OrderedDict[str, str] = OrderedDict()

    async def of(self, image: ImageSegment) -> str:
        """A data URL of the client's own image bytes (JPEG-encoded once when there are none)."""
        url = self._urls.get(image.key)
        if url is None:
            raw = image.jpeg
            if raw is None:
                raw = await anyio.to_thread.run_sync(_encode_jpeg, image)
            url = f"data:{_mime(raw)};base64,{base64.b64encode(raw).decode('ascii')}"
            self._urls[image.key] = url
            while len(self._urls) > self.size:
                self._urls.popitem(last=False)
        else:
            self._urls.move_to_end(image.key)
        return url


async def chat_body(
    model: str | None, prompt: Prompt, sampling: Sampling, data_urls: DataUrls, holder: Replica | None
) -> Body:
    """The chat completion request for ``prompt`` (an open turn is sent closed).

    Images that ``holder`` holds are named by uuid alone; the others carry their data
    (with their content key as uuid, so the server can hold them from now on).
    """
    messages = []
    sent: list[str] = []
    referenced = 0
    for turn in prompt.turns:
        parts: list[dict[str, Any]] = []
        for seg in turn.segments:
            if isinstance(seg, TextSegment):
                parts.append({"type": "text", "text": plain_text(seg.text)})
            elif isinstance(seg, ImageSegment):
                if holder is not None and holder.holds(seg.key):
                    parts.append({"type": "image_url", "image_url": None, "uuid": seg.key})
                    referenced += 1
                    continue
                url = await data_urls.of(seg)
                parts.append({"type": "image_url", "image_url": {"url": url}, "uuid": seg.key})
                sent.append(seg.key)
        if all(p["type"] == "text" for p in parts):
            messages.append({"role": turn.role, "content": "".join(p["text"] for p in parts)})
        else:
            messages.append({"role": turn.role, "content": parts})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return Body(body, sent, referenced)


def plain_text(text: str) -> str:
    """User text for a remote server: every ``<`` that could open a special token is followed
    by a zero-width space, so the server's tokenizer reads no special token in it."""
    return _MARKUP_START.sub("<\u200b", text)


def _mime(raw: bytes) -> str:
    if raw[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if raw[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def _encode_jpeg(image: ImageSegment) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image.pixels()).save(buf, "JPEG", quality=90)
    return buf.getvalue()
