"""A session's camera: frames as they come, sized, filtered, buffered and acked.

``Camera`` holds the frame buffer (``frames.py``), the similarity filter's verdict on each
frame (``handlers/media/similarity.py``), the session's first frame (the prompt's times count
from it) and the last frame it took; it makes each frame's ``FrameAcked``, a frame shed at intake
(the server could not keep up) included. Pure and
synchronous, like the rest of the core: the session core feeds it prepared frames and adds
what the rest of the session needs (the conversation's items, whether a warm-up is due).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from handlers.core.events import FrameAcked
from handlers.core.frames import Frame, FrameBuffer
from handlers.media.similarity import DEFAULT_THRESHOLD, SimilarityFilter
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import SessionConfig, VideoFrame

#: ``detail: "low"``: an image goes to the model at most this size (and half the model's at most).
LOW_DETAIL_SIDE = 512


@dataclass(frozen=True, slots=True)
class FrameIntake:
    """What happened to one incoming frame: the ``ack`` to send (when the frame has an id),
    the frame buffered (None: filtered), the frames evicted, and whether the warm prefix is
    behind now (``warm_due``: the core has told its turns)."""

    ack: FrameAcked | None
    frame: Frame | None  # the buffered frame, None when filtered
    evicted: list[Frame]
    warm_due: bool = False


def frame_item(frame_id: str | int | None) -> str | None:
    """A frame's conversation item id (its client's id, as text), or None for an unnamed frame."""
    return None if frame_id is None else str(frame_id)


def image_side(event: VideoFrame, model_side: int | None) -> int | None:
    """The largest side the frame's picture goes to the model at: the model's (``detail``
    ``high`` or ``auto``), or for ``low`` at most ``LOW_DETAIL_SIDE`` and half the model's."""
    if event.detail != "low":
        return model_side
    return LOW_DETAIL_SIDE if model_side is None else max(28, min(LOW_DETAIL_SIDE, model_side // 2))


def _similarity_filter(config: SessionConfig) -> SimilarityFilter:
    threshold = config.frame_filter_threshold
    return SimilarityFilter(DEFAULT_THRESHOLD if threshold is None else threshold, config.enable_frame_filter)


class Camera:
    """One session's frames (see the module docstring)."""

    def __init__(self, config: SessionConfig, bulk_eviction: bool = False) -> None:
        self.buffer = FrameBuffer(config.max_frames)
        self.buffer.bulk_eviction = bulk_eviction  # a warm prefix is kept: evict half the window at once
        self.filter = _similarity_filter(config)
        self.origin: Frame | None = None  # the session's first frame
        self._seq = itertools.count()
        self.last_frame_id: str | int | None = None  # the last frame taken (a resumed client resends after it)

    def reconfigure(self, old: SessionConfig, new: SessionConfig) -> None:
        """A running session's config changed: a smaller window evicts at the next frame; a new
        filter setting starts the filter afresh."""
        self.buffer.max_frames = new.max_frames
        if (new.enable_frame_filter, new.frame_filter_threshold) != (old.enable_frame_filter, old.frame_filter_threshold):
            self.filter = _similarity_filter(new)

    @staticmethod
    def check_size(event: VideoFrame, max_bytes: int) -> None:
        """Raises ``frame_too_large`` before any work is spent on an oversized frame."""
        if len(event.data) > max_bytes:
            raise SessionError(
                ErrorCode.FRAME_TOO_LARGE, f"frame data is {len(event.data)} bytes; the limit is {max_bytes}",
                frame_id=frame_item(event.frame_id),
            )

    def accept(
        self, event: VideoFrame, data: bytes, key: str, thumb: object, now_ms: float, previous: str | None,
    ) -> FrameIntake:
        """Filter and buffer a frame whose bytes decoded; returns its ack (``previous``: the
        conversation item before it) and what was evicted."""
        if event.frame_id is not None:
            self.last_frame_id = event.frame_id
        decision = self.filter.check(thumb)
        if not decision.keep:
            return FrameIntake(self._ack(event, now_ms, False, decision.similarity, [], previous), None, [])
        frame = Frame(
            seq=next(self._seq), key=key, data=data, receive_ts_ms=now_ms, frame_id=event.frame_id,
            pts_ms=event.pts_ms, source_pts_ms=event.source_pts_ms, capture_ts_ms=event.capture_ts_ms,
            quality_profile=event.quality_profile,
        )
        if self.origin is None:
            self.origin = frame
        evicted = self.buffer.add(frame)
        return FrameIntake(self._ack(event, now_ms, True, decision.similarity, evicted, previous), frame, evicted)

    def shed(self, event: VideoFrame, now_ms: float, previous: str | None) -> FrameAcked | None:
        """A frame dropped at intake because the server cannot keep up: its ack says so
        (``reason: "overloaded"``); nothing is buffered."""
        ack = self._ack(event, now_ms, False, 0.0, [], previous)
        return None if ack is None else ack.model_copy(update={"reason": "overloaded", "similarity": None})

    def _ack(
        self, event: VideoFrame, now_ms: float, accepted: bool, similarity: float, evicted: list[Frame],
        previous: str | None,
    ) -> FrameAcked | None:
        if event.frame_id is None:
            return None
        dropped = [f.frame_id for f in evicted if f.frame_id is not None]
        return FrameAcked(
            frame_id=event.frame_id, pts_ms=event.pts_ms, capture_ts_ms=event.capture_ts_ms, accepted=accepted,
            buffered_frames=len(self.buffer), server_receive_ts_ms=now_ms, reason=None if accepted else "filtered",
            similarity=round(similarity, 4), dropped_frame_id=dropped[0] if dropped else None,
            dropped_frame_ids=dropped, previous_item_id=previous,
        )
