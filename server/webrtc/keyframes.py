"""Decode only the camera frames a call keeps.

aiortc decodes every frame a video track brings (30 a second from a browser), while a session
samples 2. ``KeyframeGate`` stands between aiortc's receiver and its decoder thread: a frame
goes to the decoder only when a sample is due and the frame is a keyframe (which decodes on
its own); when a sample is due and only inter frames come, it asks the sender for a keyframe
(an RTCP picture loss indication, as a receiver does after a loss; browsers answer it with
their next frame). Frames in between are never decoded. A sender that does not answer
within ``FALLBACK_S`` (or a codec the gate cannot read) gets the old way: every frame decoded
from the next keyframe on, the camera pump sampling them.

The gate is put where aiortc's receiver puts its encoded frames (``put``, on the event loop);
the decoder thread keeps reading the queue it was given.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from server.webrtc.media import Sampler

log = logging.getLogger("livesight.webrtc")

#: RTP's video clock.
VIDEO_HZ = 90_000
#: Keyframe requests for one due sample, at most this often.
PLI_INTERVAL_S = 0.25
#: A sender that sends no keyframe this long after the first request is decoded in full.
FALLBACK_S = 2.0


def is_keyframe(codec: str, data: bytes) -> bool | None:
    """Whether an encoded frame decodes on its own (None: a codec this cannot read)."""
    if not data:
        return False
    if codec == "VP8":
        return not data[0] & 0x01  # the frame tag's inverse key-frame bit (RFC 6386, 9.1)
    if codec == "H264":  # Annex B: an IDR slice (type 5) or a parameter set starts it
        i = data.find(b"\x00\x00\x01")
        while i != -1 and i + 3 < len(data):
            if data[i + 3] & 0x1F in (5, 7):
                return True
            i = data.find(b"\x00\x00\x01", i + 3)
        return False
    return None


class KeyframeGate:
    """aiortc's decoder queue for one camera track, letting through what the session keeps."""

    def __init__(self, inner: queue.Queue, sampler: Sampler, request_keyframe: Callable[[], Any]) -> None:
        self.inner = inner
        self.sampler = sampler
        self.request_keyframe = request_keyframe
        self.passed = 0
        self.skipped = 0
        self.requests = 0
        self._asked_at: float | None = None
        self._last_request = 0.0
        sampler.gated = True

    def put(self, item: Any) -> None:
        if item is None or not self.sampler.gated:
            self.inner.put(item)
            return
        codec, frame = item
        at_s = frame.timestamp / VIDEO_HZ
        key = is_keyframe(codec.name, frame.data)
        if key is None:
            self._fall_back(f"codec {codec.name}")
            self.inner.put(item)
            return
        if not self.sampler.due(at_s):
            self.skipped += 1
            return
        if key:
            self.sampler.keep(at_s)
            self.passed += 1
            self._asked_at = None
            self.inner.put(item)
            return
        self.skipped += 1
        now = time.monotonic()
        if self._asked_at is None:
            self._asked_at = now
        elif now - self._asked_at > FALLBACK_S:
            self._fall_back("the sender sends no keyframe when asked")
            return
        if now - self._last_request >= PLI_INTERVAL_S:
            self._last_request = now
            self.requests += 1
            result = self.request_keyframe()
            if asyncio.iscoroutine(result):
                asyncio.ensure_future(result)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get(*args, **kwargs)

    def _fall_back(self, why: str) -> None:
        log.info("camera track: every frame decoded from now on (%s)", why)
        self.sampler.gated = False
