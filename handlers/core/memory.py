"""What a session remembers and how it asks its memory. Pure.

- ``Keyframes`` decides which accepted frames become *moments*: the first, each scene change
  (less than ``scene_similarity`` of the similarity thumbnail's cells unchanged since the
  last keyframe, at most one every ``min_keyframe_s``: a panning camera changes every frame)
  and at least one every ``keyframe_s``.
- ``resolve_range`` turns a client's range (wall-clock ms, negative: before now) into one
  span of the past.
- ``recalled_frames`` turns moments read back from the store into frames a prompt can show
  (out of the window: released after the answer that pins them).
- ``SearchRun`` is one ``memory.search`` under way: the moments of its range left to check,
  the batch loaded for the next check, and what it found.

The store itself (``server/memory``) is the executor's; the core only says what to keep and
what to read (``KeepMoment``, ``KeepNote``, ``Recall``, ``FindMemory``, ``LoadMoments``,
``ForgetMemory``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from handlers.core.events import MemoryHit
from handlers.core.frames import Frame
from handlers.core.negotiation import MemoryPolicy
from handlers.media.frame_image import FrameImage
from handlers.media.similarity import NormalisedThumbnail, similarity
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import MemorySearch

#: Frames a question about a range shows at most (and at most ``num_frames``): each is a cold
#: prefill of a keyframe.
RECALL_FRAMES = 16
#: Moments one round of a condition search checks.
SEARCH_BATCH = 8


@dataclass(frozen=True, slots=True)
class RecalledMoment:
    """A moment read back from the store: its span (wall clock, ms), its keyframe (JPEG of
    ``size``, width x height) and its caption."""

    moment_id: int
    start_ms: float
    end_ms: float
    jpeg: bytes = b""
    size: tuple[int, int] = (0, 0)
    caption: str | None = None


@dataclass(frozen=True, slots=True)
class TextFound:
    """A text search's hit: when, what kind of record, its text, and its moment."""

    at_ms: float
    kind: str
    text: str
    moment: RecalledMoment | None


class Keyframes:
    """Which accepted frames become moments (see the module docstring)."""

    def __init__(self, policy: MemoryPolicy) -> None:
        self.policy = policy
        self._last_ms: float | None = None
        self._last_thumb: NormalisedThumbnail | None = None

    def take(self, thumb: NormalisedThumbnail | None, at_ms: float) -> bool:
        """True when the frame received at ``at_ms`` (with its similarity thumbnail, if any)
        is a keyframe; it becomes the reference for the next."""
        since = None if self._last_ms is None else at_ms - self._last_ms
        due = since is None or since >= self.policy.keyframe_s * 1000
        if not due and thumb is not None and self._last_thumb is not None and since >= self.policy.min_keyframe_s * 1000:
            try:
                due = similarity(self._last_thumb, thumb) < self.policy.scene_similarity
            except ValueError:  # another thumbnail shape: a new camera
                due = True
        if due:
            self._last_ms, self._last_thumb = at_ms, thumb
        return due


#: Captions a session holds for its prompts' context (the newest).
EARLIER_CAPTIONS = 64


class Earlier:
    """The captions of the session's moments, for the context of its questions: what left
    the window, told in a line of text (see ``render``)."""

    def __init__(self) -> None:
        self._captions: deque[tuple[float, str]] = deque(maxlen=EARLIER_CAPTIONS)

    def add(self, start_ms: float, caption: str) -> None:
        self._captions.append((start_ms, " ".join(caption.split())))

    def render(self, before_ms: float, origin_ms: float, budget_chars: int) -> str | None:
        """The captions of the moments that started before ``before_ms`` (the window's first
        frame), each with its span in seconds since ``origin_ms`` (the session's first frame; the
        newest is open-ended, so the text stays the same while frames leave within a moment),
        the newest that fit in ``budget_chars``; None when there are none."""
        captions = sorted(c for c in self._captions if c[0] < before_ms)
        spans = [(start, captions[n + 1][0] if n + 1 < len(captions) else None, text)
                 for n, (start, text) in enumerate(captions)]
        lines: list[str] = []
        used = 0
        for start, end, text in reversed(spans):
            until = "" if end is None else f"{max(0.0, (end - origin_ms) / 1000):.1f}s"
            line = f"[{max(0.0, (start - origin_ms) / 1000):.1f}s-{until}] {text}"
            if used + len(line) + 1 > budget_chars:
                break
            lines.append(line)
            used += len(line) + 1
        if not lines:
            return None
        return "Earlier, before these frames:\n" + "\n".join(reversed(lines))


def resolve_range(from_ms: float | None, to_ms: float | None, now_ms: float) -> tuple[float, float]:
    """The span ``from_ms``..``to_ms`` in wall-clock ms (negative: that long before now;
    absent: the start of time, or now). Raises ``invalid_message`` for an empty span."""
    start = 0.0 if from_ms is None else (now_ms + from_ms if from_ms < 0 else from_ms)
    end = now_ms if to_ms is None else (now_ms + to_ms if to_ms < 0 else to_ms)
    if start > end:
        raise SessionError(ErrorCode.INVALID_MESSAGE, "the range ends before it starts")
    return start, end


def recalled_frames(moments: list[RecalledMoment]) -> list[Frame]:
    """Frames for moments read back from the store, out of the window (so the last unpin
    releases them); their ids name the moments (``moment_<id>``), their ``seq`` is negative
    (no frame of the window has it)."""
    frames = []
    for moment in moments:
        frame = Frame(
            seq=-1 - moment.moment_id, key=f"moment:{moment.moment_id}:{len(moment.jpeg)}", data=moment.jpeg,
            receive_ts_ms=moment.start_ms, frame_id=f"moment_{moment.moment_id}", in_window=False,
        )
        frame.image = FrameImage.encoded(moment.jpeg, moment.size, None)
        frames.append(frame)
    return frames


def moment_url(session_id: str, moment_id: int) -> str:
    """Where a moment's keyframe is served (same authentication as the session)."""
    return f"/v1/sessions/{session_id}/moments/{moment_id}.jpg"


@dataclass(eq=False)
class SearchRun:
    """One ``memory.search`` under way (see the module docstring)."""

    event: MemorySearch
    from_ms: float
    to_ms: float
    pending: deque[RecalledMoment] = field(default_factory=deque)
    batch: list[RecalledMoment] = field(default_factory=list)
    loading: bool = False
    requested: int = 0  # moments of the batch being loaded
    hits: list[MemoryHit] = field(default_factory=list)
    total: int = 0
    checked: int = 0
    skipped: int = 0

    @property
    def search_id(self) -> str | None:
        return self.event.search_id

    def next_batch(self) -> list[RecalledMoment]:
        """The moments to load for the next check (taken off ``pending``)."""
        batch = []
        while self.pending and len(batch) < SEARCH_BATCH:
            batch.append(self.pending.popleft())
        return batch

    @property
    def finished(self) -> bool:
        return not self.pending and not self.batch and not self.loading

    def best(self) -> list[MemoryHit]:
        """What it found, best first, at most ``limit``."""
        ranked = sorted(self.hits, key=lambda h: (-(h.probability or 0.0), -h.start_ms))
        return ranked[: self.event.limit]
