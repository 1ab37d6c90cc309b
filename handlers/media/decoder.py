"""Image decoding for frames: pure, synchronous, safe on untrusted bytes.

``decode_image`` does the whole decode in the calling thread (the session runs it in its
thread pool, off the event loop) and returns the pixels as a numpy array (H x W x 3, uint8,
RGB, owning its memory), decoded at most at the size the model will use.

A JPEG decodes with libjpeg-turbo's TurboJPEG API straight into the array (``simplejpeg``;
a 640x480 footage frame: 0.75-0.9 ms against 1.0-1.4 ms for Pillow's load, which also
stores 4 bytes a pixel, then ~0.45 ms more to make an array of it); one at least twice
``max_side`` is decoded at 1/2, 1/4 or 1/8 scale, the scales libjpeg-turbo does with SIMD
(its odd scales, like 7/8, cost more than a full decode). Pillow decodes PNG, WebP, CMYK JPEG, a JPEG whose EXIF
orientation turns it, and any JPEG libjpeg-turbo warns about (Pillow decides whether it is
readable, and refuses a truncated one).

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

import numpy as np
import simplejpeg
from PIL import Image, ImageOps

from handlers.media.pixel_pool import POOL

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
        check_size(img.size, max_pixels=max_pixels, max_aspect_ratio=max_aspect_ratio)
        try:
            yield img
        except _DECODE_ERRORS as exc:
            # Pillow's own messages are not for clients.
            raise ValueError(message) from exc


def check_size(size: tuple[int, int], *, max_pixels: int, max_aspect_ratio: float) -> None:
    """Refuse an image of ``size`` (width, height) with no pixels, more than ``max_pixels``,
    or a long side more than ``max_aspect_ratio`` times its short side (``ValueError``)."""
    width, height = size
    if width <= 0 or height <= 0:
        raise ValueError("image has zero size")
    if width * height > max_pixels:
        raise ValueError(f"image too large: {width}x{height} pixels, limit {max_pixels}")
    if max(width, height) > max_aspect_ratio * min(width, height):
        raise ValueError(f"image too elongated: {width}x{height}, aspect ratio limit {max_aspect_ratio:g}")


def plain_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG that TurboJPEG decodes as Pillow would (YCbCr, RGB or
    grayscale) and that has no EXIF block (whose orientation could turn it), read from its
    header by libjpeg-turbo; None for anything else, which ``open_image`` then reads.

    The webcam case skips Pillow's header parser, which is Python and holds the GIL (under
    200 sessions it was a fifth of the decode threads' GIL time); nothing is checked here
    (``check_size`` is the caller's)."""
    if data[:3] != b"\xff\xd8\xff" or _has_exif(data):
        return None
    try:
        height, width, colourspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None  # e.g. a sampling TurboJPEG cannot name: Pillow decides
    if colourspace not in _TURBO_COLOURSPACES:
        return None
    return width, height


def _has_exif(data: bytes) -> bool:
    """Whether the JPEG's header segments (before the first scan) hold an EXIF block; True
    for a header this walk cannot follow, so that Pillow reads it."""
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return True
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xDA, 0xD9):  # start of scan, end of image
            return False
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return True
        pos += 2 + length
    return True


#: A decoded frame up to this factor above ``max_side`` is left as it is. The model's
#: processor resamples every frame to its own grid anyway, so a resize at intake buys only
#: memory (at 1.5 a held frame has at most 2.25 times the pixels of a fitted one), while it
#: costs a second pass over the pixels; frames a little larger than ``max_side`` (a 640x480
#: webcam frame for a 504-pixel model) and reduced-scale JPEG decodes are kept as they are.
RESIZE_SLACK = 1.5

# libjpeg-turbo's SIMD reduced-scale decodes, largest reduction first.
_FAST_SCALES = (8, 4, 2)
# JPEG colour spaces TurboJPEG turns into RGB as Pillow would (CMYK and YCCK go to Pillow).
_TURBO_COLOURSPACES = {"YCbCr", "RGB", "Gray"}
# EXIF orientations that ``ImageOps.exif_transpose`` acts on.
_TURNING_ORIENTATIONS = range(2, 9)
_ORIENTATION_TAG = 0x0112


def decode_image(
    data: bytes,
    max_side: int | None,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO,
) -> np.ndarray:
    """Decode an encoded frame to RGB pixels whose longest side is at most about ``max_side``
    (within ``RESIZE_SLACK``).

    Returns an H x W x 3 uint8 array (C-contiguous, owning its memory, no reference to
    ``data``). The EXIF orientation is applied; the aspect ratio is kept; the image is never
    upscaled; ``max_side=None`` keeps the full size.

    Raises:
        ValueError: undecodable data, a zero-size image, more than ``max_pixels``
            pixels, or an aspect ratio over ``max_aspect_ratio``.
    """
    if max_side is not None and max_side < 1:
        raise ValueError("max_side must be at least 1")
    with open_image(data, max_pixels=max_pixels, max_aspect_ratio=max_aspect_ratio) as img:
        return decode_opened(img, data, max_side)


def decode_opened(img: Image.Image, data: bytes, max_side: int | None) -> np.ndarray:
    """``decode_image`` for an image already opened (and checked) by ``open_image`` over
    ``data``: call it inside that ``with`` block, so the header is checked once. Raises what
    Pillow raises (``open_image`` turns that into ``ValueError``)."""
    if turbo_decodable(img):
        try:
            pixels = _decode_turbo(data, img.size, max_side)
        except ValueError:
            pass  # a libjpeg warning (strict) or an unexpected layout: Pillow decides
        else:
            return _fitted(pixels, max_side)
    return _decode_pillow(img, max_side)


def turbo_decodable(img: Image.Image) -> bool:
    """A plain JPEG (YCbCr, RGB or grayscale) that needs no EXIF turn: TurboJPEG decodes it."""
    if img.format != "JPEG" or img.mode not in ("RGB", "L"):
        return False
    return img.getexif().get(_ORIENTATION_TAG, 1) not in _TURNING_ORIENTATIONS


def decode_jpeg(data: bytes, size: tuple[int, int], max_side: int | None) -> np.ndarray:
    """A plain JPEG (``turbo_decodable``) of ``size`` (width, height) decoded as
    ``decode_image`` would, without parsing its header with Pillow again, into memory the
    caller owns (not the pixel pool's); TurboJPEG first, Pillow when libjpeg-turbo warns.
    Raises ``ValueError`` as ``decode_image``."""
    try:
        return _fitted(_decode_turbo(data, size, max_side, pooled=False), max_side)
    except ValueError:
        return decode_image(data, max_side)


def decode_jpeg_reduced(data: bytes, size: tuple[int, int], min_side: int) -> np.ndarray:
    """A plain JPEG (``turbo_decodable``) of ``size`` decoded at the smallest fast scale (down
    to 1/8) whose sides are still at least ``min_side`` (or at full size when smaller): for a
    thumbnail. libjpeg still reads every coefficient, and any warning is an error, so a
    corrupt or truncated JPEG fails here as it would in a full decode.

    Raises:
        ValueError: libjpeg-turbo reports an error or a warning, or its header differs.
    """
    factor = next((k for k in _FAST_SCALES if -(-min(size) // k) >= min_side), 1)
    return _decode_turbo(data, size, max(-(-size[0] // factor), -(-size[1] // factor)), pooled=False)


def _decode_turbo(data: bytes, size: tuple[int, int], max_side: int | None, *, pooled: bool = True) -> np.ndarray:
    """The JPEG's pixels by TurboJPEG, at the smallest fast scale still at least ``max_side``
    (``pooled``: into memory from the pixel pool).

    Raises:
        ValueError: libjpeg-turbo reports an error or a warning (``strict``), or its reading
            of the header differs from Pillow's (the size limits were checked on Pillow's).
    """
    width, height = size
    header_height, header_width, colourspace, _ = simplejpeg.decode_jpeg_header(data)
    if (header_width, header_height) != size or colourspace not in _TURBO_COLOURSPACES:
        raise ValueError("not a plain JPEG")
    factor = 1
    if max_side is not None:
        longest = max(width, height)
        factor = next((k for k in _FAST_SCALES if -(-longest // k) >= max_side), 1)
    # The exact 1/factor size as minimum: TurboJPEG picks the smallest scale that reaches it,
    # which is that power of two, never one of its slow odd scales.
    expected = (-(-height // factor), -(-width // factor))
    pixels = POOL.take((*expected, 3)) if pooled else np.empty((*expected, 3), np.uint8)
    try:
        decoded = simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            strict=True,
            min_height=expected[0] if factor > 1 else 0,
            min_width=expected[1] if factor > 1 else 0,
            buffer=pixels,
        )
        if decoded.shape != pixels.shape:
            raise ValueError("unexpected decoded size")
    except ValueError:
        if pooled:
            POOL.give(pixels)
        raise
    del decoded
    return pixels


def _decode_pillow(img: Image.Image, max_side: int | None) -> np.ndarray:
    """The pixels by Pillow (PNG, WebP, CMYK, EXIF-turned or irregular JPEG)."""
    if max_side is not None:
        target = _fit(img.size, max_side)
        if target != img.size:
            # JPEG only (a no-op for other formats): libjpeg decodes at the largest
            # 1/2^k scale that is still at least the target size.
            img.draft("RGB", target)
    img.load()
    ImageOps.exif_transpose(img, in_place=True)
    out: Image.Image = img
    if out.mode != "RGB":
        out = out.convert("RGB")
    out = _resized(out, max_side)
    # A copy: owns its memory and keeps nothing of Pillow's (a PNG keeps the BytesIO over
    # ``data`` and a WebP its decoder with a copy of the file).
    return np.array(out)


def _fitted(pixels: np.ndarray, max_side: int | None) -> np.ndarray:
    """``pixels`` resized to fit ``max_side`` when they are more than ``RESIZE_SLACK`` over it."""
    if max_side is None or max(pixels.shape[:2]) <= max_side * RESIZE_SLACK:
        return pixels
    return np.array(_resized(Image.fromarray(pixels), max_side))


def _resized(img: Image.Image, max_side: int | None) -> Image.Image:
    if max_side is not None and max(img.size) > max_side * RESIZE_SLACK:
        target = _fit(img.size, max_side)
        if target != img.size:
            # Bilinear with a reducing gap: a fraction of bicubic's cost, and the model's
            # processor resamples again anyway.
            return img.resize(target, Image.Resampling.BILINEAR, reducing_gap=2.0)
    return img


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
