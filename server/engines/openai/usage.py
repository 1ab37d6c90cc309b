"""Accounting for a remote engine: what an answer cost, and what crossed the network.

A remote server reports only ``prompt_tokens``, ``cached_tokens`` and ``completion_tokens``;
livesight's ``Usage`` also splits the prompt into image and audio tokens, so the split is
estimated here from the prompt's text when the server does not send it (vLLM does not).

The traffic counters exist to show, in ``GET /metrics.json``, that each frame crosses to a
replica once: images sent with data against images named by uuid, bytes per request, and the
cache misses that made a request go again with every image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypedDict

from server.engines.base import EngineStats, ImageSegment, Prompt, TextSegment, Usage

CHARS_PER_TOKEN = 4  # text length estimate where the server's tokenizer is not at hand
MARKUP_TOKENS_PER_MESSAGE = 4  # a chat template's role markers around each message, estimated


@dataclass
class Traffic:
    """Counters since the engine started: requests sent (retries included), their bytes, the
    images in them (with data, or named by uuid), cache misses, and the prompt tokens served."""

    requests: int = 0
    request_bytes: int = 0
    images_sent: int = 0
    images_referenced: int = 0
    cache_misses: int = 0
    sessions_data_only: int = 0  # sessions whose images stopped being kept between their requests
    prompt_tokens: int = 0
    prompt_tokens_computed: dict[str, int] = field(default_factory=dict)  # by work, less what was cached

    def count_request(self, size: int, images_sent: int, images_referenced: int) -> None:
        """Note one request put on the wire (``size`` bytes of body)."""
        self.requests += 1
        self.request_bytes += size
        self.images_sent += images_sent
        self.images_referenced += images_referenced

    def count_prompt(self, usage: dict[str, Any], work: str) -> None:
        """Note a finished request's prompt: its tokens, and those the server computed for ``work``."""
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        self.prompt_tokens += prompt
        self.prompt_tokens_computed[work] = self.prompt_tokens_computed.get(work, 0) + max(0, prompt - cached)


class ReplicaStats(TypedDict):
    """One replica in ``RemoteStats``: its server root, its last health, the images it holds."""

    url: str
    healthy: bool
    held_images: int


class RemoteStats(EngineStats, total=False):
    """The remote engine's ``stats()``: its replicas and its ``Traffic`` counters."""

    replicas: list[ReplicaStats]
    requests: int
    request_bytes: int
    images_sent: int
    images_referenced: int
    cache_misses: int
    sessions_data_only: int
    prompt_tokens: int


def remote_usage(usage: dict[str, Any], prompt: Prompt) -> Usage:
    """A remote answer's ``Usage`` from the server's ``usage`` record.

    The server's own ``prompt_tokens_details.image_tokens`` is used when it sends one (vLLM
    does not); otherwise image tokens are estimated as the prompt tokens less an estimate of
    its text (``CHARS_PER_TOKEN`` characters a token, ``MARKUP_TOKENS_PER_MESSAGE`` a message).
    Audio tokens (the spoken words, sent as text) are estimated the same way.
    """
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    texts = [seg.text for turn in prompt.turns for seg in turn.segments if isinstance(seg, TextSegment)]
    has_images = any(isinstance(seg, ImageSegment) for turn in prompt.turns for seg in turn.segments)
    if details.get("image_tokens") is not None:
        images = int(details["image_tokens"])
    elif has_images:
        text_estimate = sum(_estimated_tokens(t) for t in texts) + MARKUP_TOKENS_PER_MESSAGE * len(prompt.turns)
        images = max(0, prompt_tokens - text_estimate)
    else:
        images = 0
    images = min(images, prompt_tokens)
    spoken = min(_estimated_tokens(prompt.spoken) if prompt.spoken else 0, prompt_tokens - images)
    return Usage(
        prompt_tokens, int(details.get("cached_tokens") or 0), int(usage.get("completion_tokens") or 0), images, spoken
    )


def _estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)
