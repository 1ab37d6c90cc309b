"""Image decoding for frames: pure, synchronous, safe on untrusted bytes.

``decode_image`` does the whole decode in the calling thread (the session runs it in its
thread pool, off the event loop) and decodes at most at the size the model will use: a
JPEG much larger than ``max_side`` is decoded at 1/2, 1/4 or 1/8 scale by libjpeg itself
(``Image.draft``), which costs a fraction of a full decode, then resized to fit.

Only JPEG, PNG and WebP are accepted, identified by their magic bytes, and only those
Pillow plugins are ever asked to read the data: a client cannot reach Pillow's other
parsers (EPS, for one, runs Ghostscript). The pixel count and the aspect ratio are
checked from the header, before any pixel is decoded, so a small file that claims a huge
image (a decompression bomb) costs nothing, and a frame the model's processor would refuse
later (Qwen2-VL's refuses an aspect ratio over 200) is refused at intake instead.

Every failure is a ``ValueError`` with a short message that is safe to show to a client.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, ImageOps

#: Largest image accepted, in pixels (width x height), checked before decoding.
DEFAULT_MAX_PIXELS = 40_000_000
#: Largest long side / short side accepted by default (the server passes its setting).
DEFAULT_MAX_ASPECT_RATIO = 200.0

_PIL_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}

# What Pillow raises on malformed data: OSError (UnidentifiedImageError, truncated
# files), SyntaxError and struct.error from header parsers, and the rest from plugins
# reading corrupt fields.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)
# Pillow's own bomb check, in ``Image.open``: an error above twice its global limit
# (~179 MP); the warning is raised, not just logged, when warnings are made errors.
# Between ~89 and ~179 MP Pillow logs that warning once and our own check refuses.
_BOMB_ERRORS = (Image.DecompressionBombError, Image.DecompressionBombWarning)


def sniff_format(data: bytes) -> str | None:
    """Return ``"jpeg"``, ``"png"`` or ``"webp"`` from the magic bytes, else None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


@contextmanager
def open_image(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO
) -> Iterator[Image.Image]:
    """Open encoded image bytes lazily (header only) and check the size and aspect ratio.

    Yields the unloaded Pillow image; the caller may call ``draft`` on it, then must
    derive (load, convert, resize) what it keeps inside the ``with`` block.

    Raises:
        ValueError: the bytes are not a JPEG, PNG or WebP image, the header is corrupt,
            the image has no pixels, more than ``max_pixels`` pixels, or a long side more
            than ``max_aspect_ratio`` times its short side. Decoding errors
            raised inside the ``with`` block are turned into ``ValueError`` too.
    """
    fmt = sniff_format(data)
    if fmt is None:
        raise ValueError("not a JPEG, PNG or WebP image")
    message = f"cannot decode {fmt} image"
    try:
        img = Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[fmt]])
    except _BOMB_ERRORS as exc:
        raise ValueError(f"image too large: limit {max_pixels} pixels") from exc
    except _DECODE_ERRORS as exc:
        raise ValueError(message) from exc
    with img:
        width, height = img.size
        if width <= 0 or height <= 0:
            raise ValueError("image has zero size")
        if width * height > max_pixels:
            raise ValueError(f"image too large: {width}x{height} pixels, limit {max_pixels}")
        if max(width, height) > max_aspect_ratio * min(width, height):
            raise ValueError(f"image too elongated: {width}x{height}, aspect ratio limit {max_aspect_ratio:g}")
        try:
            yield img
        except _DECODE_ERRORS as exc:
            # Pillow's own messages are not for clients.
            raise ValueError(message) from exc


#: A decoded frame up to this factor above ``max_side`` is left as it is: the model's
#: processor resamples it anyway, and a second resize costs more than the decode.
RESIZE_SLACK = 1.25


def decode_image(
    data: bytes,
    max_side: int | None,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
) -> Image.Image:
    """Decode an encoded frame to an RGB image whose longest side is at most about ``max_side``
    (within ``RESIZE_SLACK``).

    The EXIF orientation is applied; the aspect ratio is kept; the image is never
    upscaled; ``max_side=None`` keeps the full size. All pixel work happens before this
    returns, and the result holds no reference to ``data``.

    Raises:
        ValueError: undecodable data, a zero-size image, more than ``max_pixels``
            pixels, or an aspect ratio over ``max_aspect_ratio``.
    """
    if max_side is not None and max_side < 1:
        raise ValueError("max_side must be at least 1")
    with open_image(data, max_pixels=max_pixels, max_aspect_ratio=max_aspect_ratio) as img:
        return decode_opened(img, max_side)


def decode_opened(img: Image.Image, max_side: int | None) -> Image.Image:
    """``decode_image`` for an image already opened (and checked) by ``open_image``: call it
    inside that ``with`` block, so the header is parsed once. Raises what Pillow raises
    (``open_image`` turns that into ``ValueError``)."""
    if max_side is not None:
        target = _fit(img.size, max_side)
        if target != img.size:
            # JPEG only (a no-op for other formats): libjpeg decodes at the largest
            # 1/2^k scale that is still at least the target size.
            img.draft("RGB", target)
    img.load()
    # In place: a copy of a 640x480 frame costs twice its decode.
    ImageOps.exif_transpose(img, in_place=True)
    out: Image.Image = img
    if out.mode != "RGB":
        out = out.convert("RGB")
    if max_side is not None and max(out.size) > max_side * RESIZE_SLACK:
        target = _fit(out.size, max_side)
        if target != out.size:
            # Bilinear with a reducing gap: a fraction of bicubic's cost, and the model's
            # processor resamples again anyway.
            out = out.resize(target, Image.Resampling.BILINEAR, reducing_gap=2.0)
    if out is img and img.format != "JPEG":
        # A loaded JPEG no longer refers to the file, but a PNG keeps the BytesIO over
        # ``data`` and a WebP its decoder with a copy of the file: detach the pixels.
        out = img.copy()
    return out


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """What an image's header says, read without decoding a pixel."""

    format: str  # "jpeg", "png" or "webp"
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def read_header(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO
) -> ImageHeader:
    """Check an encoded image from its header alone (microseconds, whatever its size).

    Raises:
        ValueError: as ``open_image``.
    """
    with open_image(data, max_pixels=max_pixels, max_aspect_ratio=max_aspect_ratio) as img:
        width, height = img.size
    return ImageHeader(sniff_format(data) or "", width, height)


def _fit(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """The size with the same aspect whose longest side is at most ``max_side``."""
    width, height = size
    longest = max(width, height)
    if longest <= max_side:
        return size
    scale = max_side / longest
    return max(1, round(width * scale)), max(1, round(height * scale))
