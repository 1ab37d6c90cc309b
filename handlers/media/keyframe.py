"""A remembered moment's keyframe: the frame as the model sees it, as a JPEG. Blocking (run
it off the loop, on ``server/blocking``'s threads)."""

from __future__ import annotations

import numpy as np
import simplejpeg

from handlers.media.decoder import decode_image, plain_jpeg_size

#: JPEG quality of a keyframe re-encoded at the model's size.
KEYFRAME_QUALITY = 85


def keyframe_jpeg(data: bytes, max_side: int | None) -> tuple[bytes, tuple[int, int]]:
    """``data`` (a client's frame, already checked at intake) as a JPEG of at most
    ``max_side`` pixels a side, and its (width, height): a plain JPEG that fits is kept as it
    came; anything else is decoded, fitted and encoded. Raises ``ValueError``."""
    size = plain_jpeg_size(data)
    if size is not None and (max_side is None or max(size) <= max_side):
        return data, size
    pixels = np.ascontiguousarray(decode_image(data, max_side))
    jpeg = simplejpeg.encode_jpeg(pixels, quality=KEYFRAME_QUALITY, colorspace="RGB")
    return jpeg, (pixels.shape[1], pixels.shape[0])


def jpeg_size(jpeg: bytes) -> tuple[int, int]:
    """(width, height) of a stored keyframe. Raises ``ValueError``."""
    height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    return width, height
