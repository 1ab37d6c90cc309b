"""Which buffered frames a query (or a warm prefix) uses.

One function decides; the prompt and ``video.frames.consumed`` are both built from its
result, so what the client is told is exactly what the model saw.
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers.frames import Frame


def select_frames(frames: Sequence[Frame], num_frames: int, use_all: bool) -> list[Frame]:
    """Return the frames for a prompt, oldest first.

    With ``use_all`` (a warm prefix is kept) every given frame is used. Otherwise
    ``num_frames`` frames are spread evenly over the buffer, always including the oldest
    and the newest.
    """
    frames = list(frames)
    if use_all or len(frames) <= num_frames:
        return frames
    if num_frames == 1:
        return [frames[-1]]
    last = len(frames) - 1
    picks = sorted({round(i * last / (num_frames - 1)) for i in range(num_frames)})
    return [frames[i] for i in picks]
