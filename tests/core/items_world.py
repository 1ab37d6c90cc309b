"""What the core tests of conversation items share: small limits and a frame fed to a core as
the adapter would, decoded."""

from __future__ import annotations

import numpy as np

from handlers.core.frames import content_key
from handlers.core.session_core import Limits, SessionCore
from handlers.media.frame_image import FrameImage
from handlers.media.similarity import thumbnail
from handlers.wire.protocol import VideoFrame
from tests.protocol_client import b64, jpeg_frame

LIMITS = Limits(
    max_frame_bytes=100_000, max_audio_bytes=1000, max_queue=10, idle_timeout_s=5, max_history_turns=2,
    max_answer_tokens=64,
)


def feed_frame(core: SessionCore, seed: int, frame_id: str) -> None:
    """A frame taken by ``core`` and decoded (a tiny picture stands for the decode)."""
    data = jpeg_frame(seed)
    event = VideoFrame(type="video.frame", data=b64(data), frame_id=frame_id)
    intake = core.accept_frame(event, data, content_key(data), thumbnail(data), 1000.0)
    assert intake.frame is not None
    intake.frame.image = FrameImage.decoded(np.zeros((4, 4, 3), np.uint8))
