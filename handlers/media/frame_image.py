"""A buffered frame's picture, held in the form that costs least until an engine reads it.

A plain JPEG (what webcams and every client here send) stays encoded: the frame keeps the
client's bytes, 15-70 KB for 640x480 against 0.9 MB of pixels, and ``pixels`` decodes them
(TurboJPEG, at the size the model uses) when an engine reads the frame, on the engine's
thread. At intake the JPEG is decoded only at 1/8 scale, for the similarity thumbnail
(``decoder.decode_jpeg_reduced``): libjpeg reads every coefficient on the way, so a corrupt
or truncated JPEG is still refused at intake, and the thumbnail costs a third of a full
decode. So a frame is decoded at full size only if a model reads it: the remote engine sends
the client's bytes as they are and never decodes, the embedded engines decode a frame when
they encode it (once, unless their KV cache is rebuilt), and frames that leave the window
unread are never decoded.

Other images (PNG, WebP, CMYK or EXIF-turned JPEGs, and JPEGs libjpeg-turbo warns about) are
decoded once at intake and kept as pixels: their decode is dear and cannot be scaled down.

Measured (640x480, one thread, this machine kind): the intake decode and thumbnail of real
footage (bikes, ~30 KB) 0.30 + 0.05 ms against 0.73 + 0.21 ms for the full decode and its
thumbnail; a synthetic 70 KB frame 0.95 + 0.05 against 1.58 + 0.33 ms.
"""

from __future__ import annotations

import numpy as np

from handlers.media.decoder import decode_jpeg
from handlers.media.pixel_pool import POOL


class FrameImage:
    """A frame's picture: pixels decoded at intake, or a JPEG decoded when it is read.

    ``pixels`` may be called from any thread; ``release`` (the frame's owner, on the event
    loop) drops the bytes and gives decoded memory back to the pixel pool.
    """

    __slots__ = ("_jpeg", "_pixels", "_size", "max_side")

    def __init__(
        self,
        *,
        pixels: np.ndarray | None = None,
        jpeg: bytes | None = None,
        size: tuple[int, int] = (0, 0),
        max_side: int | None = None,
    ) -> None:
        if (pixels is None) == (jpeg is None):
            raise ValueError("a frame image has either pixels or JPEG bytes")
        self._pixels = pixels
        self._jpeg = jpeg
        self._size = size  # the JPEG's own (width, height)
        self.max_side = max_side

    @classmethod
    def decoded(cls, pixels: np.ndarray) -> FrameImage:
        """Pixels decoded at intake (H x W x 3 uint8 RGB), held until release."""
        return cls(pixels=pixels)

    @classmethod
    def encoded(cls, jpeg: bytes, size: tuple[int, int], max_side: int | None) -> FrameImage:
        """A plain JPEG of ``size`` (width, height) whose decode is left to its readers."""
        return cls(jpeg=jpeg, size=size, max_side=max_side)

    @property
    def lazy(self) -> bool:
        """True while the picture is held encoded."""
        return self._pixels is None

    @property
    def held_bytes(self) -> int:
        """Memory the picture holds: its pixels, or its encoded bytes."""
        if self._pixels is not None:
            return self._pixels.nbytes
        return len(self._jpeg or b"")

    def pixels(self) -> np.ndarray:
        """The picture as H x W x 3 uint8 RGB at most about ``max_side`` (see
        ``decoder.RESIZE_SLACK``): the held pixels, or a fresh decode of the JPEG that the
        caller owns.

        Raises:
            ValueError: the image was released, or its bytes no longer decode.
        """
        pixels = self._pixels
        if pixels is not None:
            return pixels
        jpeg = self._jpeg
        if jpeg is None:
            raise ValueError("the frame's image was released")
        return decode_jpeg(jpeg, self._size, self.max_side)

    def release(self) -> None:
        """Drop what is held; decoded memory goes back to the pixel pool when unshared."""
        self._jpeg = None
        pixels, self._pixels = self._pixels, None
        if pixels is not None:
            POOL.give(pixels)
