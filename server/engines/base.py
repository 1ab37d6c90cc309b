"""The engine interface: what the session core asks of a model.

A prompt is a list of segments (text, image, audio). An engine turns it into its own
inputs; two prompts that share leading segments share a prefix, which an engine with
``warm_prefix`` keeps cached between calls for the same session.

Engine output is normalised into three event types: ``TextDelta``, ``AudioChunk`` and
``Finished`` (always last). Engine failures surface as ``EngineError``.

Everything that imports an engine imports this module, the session core and its tests
included, so it imports only what its records are made of (numpy arrays); Pillow is loaded
by the one helper that needs it, and engines bring their own heavy libraries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypedDict

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True, slots=True)
class TextSegment:
    """Plain prompt text (already rendered by the prompt builder)."""

    text: str


class PixelSource(Protocol):
    """A picture decoded when it is read (a frame held as its JPEG)."""

    def pixels(self) -> np.ndarray:
        """H x W x 3 uint8 RGB; raises ``ValueError`` when it cannot be decoded."""
        ...


@dataclass(frozen=True, slots=True)
class ImageSegment:
    """One frame. ``key`` is the content hash: the image's identity for caches. ``image``:
    H x W x 3 uint8 RGB pixels, or a source that decodes them when read (``pixels``, on the
    engine's thread: read them only for an image the engine must process); ``jpeg``: the
    client's encoded bytes (JPEG, PNG or WebP), if kept."""

    key: str
    image: np.ndarray | PixelSource = field(compare=False, repr=False)
    jpeg: bytes | None = field(default=None, compare=False, repr=False)

    def pixels(self) -> np.ndarray:
        """The frame's pixels (decoded now when held encoded). Raises ``ValueError``."""
        image = self.image
        return image if isinstance(image, np.ndarray) else image.pixels()


def processor_image(image: np.ndarray) -> np.ndarray | Image.Image:
    """A frame as a model's processor should get it: the H x W x 3 array itself, except for
    a frame 1 or 3 pixels tall, which HF processors would read as channels-first (they guess
    the layout of an array from its shape): that one goes as a Pillow image."""
    if image.shape[0] in (1, 3):
        from PIL import Image

        return Image.fromarray(image)
    return image


@dataclass(frozen=True, slots=True)
class AudioSegment:
    """PCM16 little-endian mono audio at 16 kHz."""

    key: str
    pcm16: bytes = field(compare=False, repr=False)


Segment = TextSegment | ImageSegment | AudioSegment


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One message of the conversation: role plus its segments in order."""

    role: Literal["system", "user", "assistant"]
    segments: tuple[Segment, ...]


@dataclass(frozen=True, slots=True)
class Prompt:
    """A whole conversation to be continued by the assistant.

    ``open_turn`` marks that the last user turn is not finished (a warm prefix):
    the engine renders it without closing the turn or adding a generation prompt.
    ``spoken``: the words of the newest question that were speech (transcribed for a model
    that cannot hear); they are in its text too, and an engine counts their tokens as
    ``Usage.audio_tokens``.
    """

    turns: tuple[ChatTurn, ...]
    open_turn: bool = False
    spoken: str = ""


#: The request ids of moments' captions (the session's memory): engines that count their work
#: count a caption's apart from answers'.
CAPTION_REQUEST_PREFIX = "caption_"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 128
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine can do; sent to clients in ``session.ready``."""

    name: str
    model: str
    audio_output: bool = False
    audio_input: bool = False
    warm_prefix: bool = False
    max_image_side: int | None = None
    token_probabilities: bool = False  # ``check`` reads yes/no from the next-token distribution
    max_images: int | None = None  # the most images one prompt may carry (None: no limit)
    # a warm prefix that loses frames at its front is moved, not computed again: the session
    # evicts its frames one at a time (``kv_shift``)
    shifts_prefix: bool = False
    # the least time between the starts of a session's warm requests of one kind (its prefix,
    # the next window's); 0: none. The session paces them (``engine_jobs``): frames that come
    # meanwhile go into the next one, and checks run in between
    warm_interval_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of generated text (never a broken UTF-8 character)."""

    text: str


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """Generated speech: a complete WAV file (24 kHz mono PCM16)."""

    wav: bytes


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one answer. ``image_tokens`` (what the prompt's images expand to) and
    ``audio_tokens`` (the tokens of ``Prompt.spoken``) are parts of ``prompt_tokens``; the rest
    of it is text. ``cached_tokens``: prompt tokens reused from the engine's cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Finished:
    """Last event of every generation."""

    finish_reason: Literal["stop", "length", "abort"]
    usage: Usage


EngineEvent = TextDelta | AudioChunk | Finished


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One yes/no check: ``probability`` that the answer starts with yes (the next token's
    probability of a yes word over that of a yes or a no word); its prompt's tokens and how
    many of them came from the engine's cache."""

    probability: float
    prompt_tokens: int = 0
    cached_tokens: int = 0


#: First words that count as yes or as no in a check (each engine matches its tokens to them,
#: case-insensitively, with or without a leading space).
YES_WORDS = ("yes",)
NO_WORDS = ("no",)


class EngineError(Exception):
    """The engine could not serve a request. The message is safe to log, not to send."""


class EngineStats(TypedDict, total=False):
    """What an engine reports of its own state in ``GET /metrics.json`` (under ``engine``).

    Every key is optional, since an engine reports only what it can see; one with more to say
    extends this record with keys of its own. Values are plain JSON. ``running_requests``:
    requests the engine is serving now (none may be left once sessions settle);
    ``cache_misses``: requests refused because they named an image by uuid that the model's
    server no longer held, and sent again with the image's data; ``prompt_tokens_computed``:
    prompt tokens the model computed since the engine started, less what its cache served, by
    the work they were for (``warm``: warm prefixes, ``check``: watch checks, ``answer``); ``kv_shifts``: warm prefixes moved
    rather than computed again when frames left their front.
    """

    running_requests: int
    cache_misses: int
    prompt_tokens_computed: dict[str, int]
    kv_shifts: int


class Engine(ABC):
    """A model behind six calls, and two reports on it (``kv_cache_tokens``, ``stats``).
    Implementations must be safe to call from one event loop for many sessions at once."""

    capabilities: Capabilities

    async def start(self) -> None:
        """Load the model. Raises ``EngineError`` if it cannot be loaded."""

    async def close(self) -> None:
        """Release the model and every session's cache."""

    @abstractmethod
    def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        """Stream the answer to ``prompt``; the last event is ``Finished``.

        Closing the iterator early (or cancelling the task consuming it) aborts the request
        within one decoding step. Raises ``EngineError``.
        """

    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        """Extend the session's cached prefix to cover ``prompt`` (an open turn).

        Returns how many prompt tokens are now cached. Cancelling it is safe: whatever was
        cached before stays valid. Engines without ``warm_prefix`` return 0.
        """
        return 0

    async def check(self, session_id: str, request_id: str, prompts: list[Prompt]) -> list[CheckResult]:
        """For each prompt (a closed question turn, like a query's), how likely its answer
        starts with yes: read from the next token's distribution, with no decode step, and
        nothing of it kept (the session's cached prefix is as it was). The prompts of one call
        share their leading segments (the session's prefix): batch them where the engine can.

        Cancelling it is safe. Raises ``EngineError``, also when the engine gives no token
        probabilities (``capabilities.token_probabilities`` False).
        """
        raise EngineError(f"engine {self.capabilities.name!r} gives no token probabilities")

    async def release(self, session_id: str) -> None:
        """Forget everything cached for a session (it has ended)."""

    def kv_cache_tokens(self) -> int | None:
        """Tokens this engine holds in its KV caches now, or None when the cache lives elsewhere."""
        return None

    def stats(self) -> EngineStats:
        """The engine's counters and state for monitoring; empty for an engine with none.

        Cheap and non-blocking: it is read on the event loop, on every metrics request.
        """
        return EngineStats()
