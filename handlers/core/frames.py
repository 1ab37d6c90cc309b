"""Frames and the per-session frame buffer: a bounded FIFO window with pinning.

A ``Frame`` holds one client frame: its encoded bytes, its metadata and, once checked at
intake, its picture (``FrameImage``: a JPEG kept encoded until an engine reads it, or pixels
decoded at intake). ``FrameBuffer`` keeps the last
``max_frames`` of them. A frame that a running answer or warmup uses is *pinned*: it may
leave the window, but keeps its bytes and image until its last unpin. A frame that is out
of the window and unpinned is *released* at once (bytes and image dropped): nothing
outlives its use.

Pure and synchronous; not thread-safe. Use it from the session's event loop only, and
set ``Frame.image`` there when intake has checked the image.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from handlers.media.frame_image import FrameImage
from handlers.media.preparation import content_key  # noqa: F401 (a frame's identity)


# Every Frame of the process, weakly: the leak check behind ``live_frame_count``.
_ALL_FRAMES: weakref.WeakSet[Frame] = weakref.WeakSet()


def live_frame_count() -> int:
    """Return how many frames in this process still hold their bytes or image.

    A frame counts until it is released or garbage-collected, so after every session has
    ended this is 0 unless something leaks frames (run ``gc.collect()`` first to discount
    frames that are merely waiting for the cycle collector).
    """
    return sum(1 for frame in list(_ALL_FRAMES) if not frame.released or frame.image is not None)


@dataclass(eq=False)
class Frame:
    """One frame of a session; compared by identity."""

    seq: int  # server-assigned, strictly increasing per session
    key: str  # content hash of the encoded bytes (hex)
    data: bytes | None  # encoded JPEG/PNG/WebP bytes; None once released
    receive_ts_ms: float  # server wall clock (ms since epoch) at receipt
    frame_id: str | None = None
    pts_ms: float | None = None
    source_pts_ms: float | None = None
    capture_ts_ms: float | None = None
    quality_profile: str | None = None
    image: FrameImage | None = None  # set once intake has checked (and maybe decoded) it
    decode_ms: float | None = None
    decoded_ts_ms: float | None = None
    pins: int = 0
    in_window: bool = True

    def __post_init__(self) -> None:
        _ALL_FRAMES.add(self)

    @property
    def released(self) -> bool:
        """True once the frame's bytes and image have been dropped."""
        return self.data is None

    @property
    def ready(self) -> bool:
        """True when the frame's image is checked and not released."""
        return self.image is not None

    def release(self) -> None:
        """Drop the bytes and the image (decoded memory goes back to the pixel pool when
        nothing else uses it); metadata stays for reporting."""
        self.data = None
        image, self.image = self.image, None
        if image is not None:
            image.release()


class FrameBuffer:
    """The last ``max_frames`` frames of a session, oldest first.

    Eviction makes room for a new frame when the window is full: by default the oldest
    frame goes; with ``bulk_eviction`` set (a warm prefix is kept), the oldest half goes
    at once, so the prefix, which starts at the oldest frame, is rebuilt rarely. ``hold``
    frames more may come first (the session sets it while the window after that eviction is
    not warm yet: ``window_slide``).
    """

    def __init__(self, max_frames: int) -> None:
        if max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        self.max_frames = max_frames
        self.bulk_eviction = False
        self.hold = 0  # frames the window may hold past max_frames before it evicts
        self.evicted_total = 0
        self._window: deque[Frame] = deque()
        # Pinned frames that have left the window; released on their last unpin.
        self._detached: dict[int, Frame] = {}
        self._last_seq: int | None = None

    def __len__(self) -> int:
        return len(self._window)

    @property
    def frames(self) -> list[Frame]:
        """The frames in the window, oldest first (a copy)."""
        return list(self._window)

    @property
    def latest(self) -> Frame | None:
        """The newest frame in the window, or None when it is empty."""
        return self._window[-1] if self._window else None

    @property
    def retained(self) -> int:
        """Frames holding data: the window plus pinned frames that have left it."""
        return len(self._window) + len(self._detached)

    def ready_frames(self) -> list[Frame]:
        """The frames in the window whose image is checked, oldest first."""
        return [frame for frame in self._window if frame.image is not None]

    def add(self, frame: Frame) -> list[Frame]:
        """Append a frame, evicting to make room; return the evicted frames, oldest first.

        Evicted frames that are not pinned are released before this returns.

        Raises:
            ValueError: the frame is released, or its ``seq`` is not above the last one.
        """
        if frame.released:
            raise ValueError("cannot add a released frame")
        if self._last_seq is not None and frame.seq <= self._last_seq:
            raise ValueError(f"frame seq {frame.seq} is not after {self._last_seq}")
        evicted: list[Frame] = []
        if len(self._window) >= self.max_frames + max(0, self.hold):
            count = max(1, self.max_frames // 2) if self.bulk_eviction else 1
            # More than that if the window is over-full (held past a hold, or max_frames shrank).
            count = max(count, len(self._window) - self.max_frames + 1)
            for _ in range(count):
                old = self._window.popleft()
                self._leave_window(old)
                evicted.append(old)
            self.evicted_total += count
        frame.in_window = True
        self._window.append(frame)
        self._last_seq = frame.seq
        return evicted

    def remove(self, frame: Frame) -> bool:
        """Take a frame out of the window (e.g. its decode failed); False if it was not in.

        The frame is released unless pinned.
        """
        if not frame.in_window or frame not in self._window:
            return False
        self._window.remove(frame)
        self._leave_window(frame)
        return True

    def pin(self, frames: Iterable[Frame]) -> None:
        """Hold frames (one count each) so they keep their data after leaving the window.

        Raises:
            ValueError: a frame is already released; then nothing is pinned.
        """
        frames = list(frames)
        if any(frame.released for frame in frames):
            raise ValueError("cannot pin a released frame")
        for frame in frames:
            frame.pins += 1

    def unpin(self, frames: Iterable[Frame]) -> None:
        """Drop one hold on each frame; a frame out of the window is released at its last.

        Raises:
            ValueError: a frame is not pinned; then nothing is unpinned.
        """
        frames = list(frames)
        if any(frame.pins <= 0 for frame in frames):
            raise ValueError("cannot unpin a frame that is not pinned")
        for frame in frames:
            frame.pins -= 1
            if frame.pins == 0 and not frame.in_window:
                self._detached.pop(id(frame), None)
                frame.release()

    def decoded_image(self, key: str) -> FrameImage | None:
        """The image of a live checked frame with this content key, or None.

        Lets an identical frame reuse an image instead of checking the bytes again.
        """
        for frame in reversed(self._window):
            if frame.key == key and frame.image is not None:
                return frame.image
        for frame in self._detached.values():
            if frame.key == key and frame.image is not None:
                return frame.image
        return None

    def close(self) -> None:
        """Release every frame, pinned or not, and empty the window (session end)."""
        for frame in self._window:
            frame.in_window = False
            frame.release()
        for frame in self._detached.values():
            frame.release()
        self._window.clear()
        self._detached.clear()

    def _leave_window(self, frame: Frame) -> None:
        frame.in_window = False
        if frame.pins > 0:
            self._detached[id(frame)] = frame
        else:
            frame.release()
