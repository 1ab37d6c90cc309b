"""The similarity filter: thumbnails, the metric, and which frames it keeps."""

from __future__ import annotations

import base64
import io
from itertools import pairwise

import numpy as np
import pytest
from PIL import Image

from handlers.media.decoder import decode_image
from handlers.media.similarity import (
    DEFAULT_THRESHOLD,
    FilterDecision,
    SimilarityFilter,
    similarity,
    thumbnail,
    thumbnail_of,
)
from server.bench.footage import load_footage

WIDTH, HEIGHT = 320, 240


def background(seed: int = 0) -> np.ndarray:
    """A smooth textured scene (blobs of colour), float RGB in 0..255."""
    rng = np.random.default_rng(seed)
    coarse = (rng.random((6, 8, 3)) * 255).astype(np.uint8)
    smooth = Image.fromarray(coarse).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)
    return np.asarray(smooth, dtype=np.float32)


def scene(x: int, base: np.ndarray, *, gain: float = 1.0, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """The background with a 48x48 white square whose left edge is at ``x``."""
    pixels = base.copy()
    pixels[96:144, x : x + 48] = 255.0
    pixels *= gain
    if noise:
        pixels += np.random.default_rng(seed).normal(0.0, noise, pixels.shape)
    return pixels


def encode(pixels: np.ndarray, fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    image.save(out, fmt, **({"quality": 80} if fmt == "JPEG" else {}))
    return out.getvalue()


@pytest.fixture(scope="module")
def moving_thumbs() -> list[np.ndarray]:
    """A small square crossing the scene 6 px per frame: each frame changes a little."""
    base = background()
    return [thumbnail(encode(scene(x, base, noise=2.0, seed=x))) for x in range(0, 270, 6)]


@pytest.fixture(scope="module")
def panning_thumbs() -> list[np.ndarray]:
    """A slow camera pan, 4 px (1.25% of the width) per frame, with sensor noise."""
    coarse = (np.random.default_rng(3).random((12, 32, 3)) * 255).astype(np.uint8)
    wide = np.asarray(Image.fromarray(coarse).resize((4 * WIDTH, HEIGHT), Image.Resampling.BICUBIC), np.float32)
    noise = np.random.default_rng(4)
    return [
        thumbnail(encode(wide[:, x : x + WIDTH] + noise.normal(0.0, 2.0, (HEIGHT, WIDTH, 3)))) for x in range(0, 120, 4)
    ]


def kept(threshold: float, thumbs: list[np.ndarray]) -> int:
    filt = SimilarityFilter(threshold)
    return sum(filt.check(t).keep for t in thumbs)


def test_thumbnail_of_jpeg_and_png_is_a_small_colour_array() -> None:
    """A JPEG and a PNG of one picture give 32x32 RGB float32 thumbnails in 0..1 that match."""
    pixels = scene(100, background())
    from_jpeg = thumbnail(encode(pixels, "JPEG"))
    from_png = thumbnail(encode(pixels, "PNG"))
    for thumb in (from_jpeg, from_png):
        assert thumb.shape == (32, 32, 3) and thumb.dtype == np.float32
        assert 0.0 <= thumb.min() and thumb.max() <= 1.0
    # The JPEG path samples at 1/8 scale first, so a few cells on sharp edges differ.
    assert similarity(from_jpeg, from_png) >= 0.97
    assert thumbnail(encode(pixels, "WEBP"), side=16).shape == (16, 16, 3)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\xff\xd8\xff\xe0" + b"\x00" * 64, b"GIF89a" + b"\x00" * 32],
)
def test_thumbnail_of_garbage_raises_value_error(data: bytes) -> None:
    """Bytes that are not a decodable JPEG, PNG or WebP raise ValueError."""
    with pytest.raises(ValueError):
        thumbnail(data)


def test_thumbnail_of_truncated_jpeg_raises_value_error() -> None:
    """A JPEG cut short raises ValueError rather than giving a half-grey thumbnail."""
    data = encode(scene(0, background()))
    with pytest.raises(ValueError):
        thumbnail(data[: len(data) // 2])


def test_similarity_ignores_brightness_and_noise_but_sees_motion() -> None:
    """Exposure change and sensor noise leave similarity at 1; a moved object lowers it."""
    base = background()
    reference = thumbnail(encode(scene(100, base)))
    flicker = thumbnail(encode(scene(100, base, gain=0.9, noise=3.0, seed=1)))
    moved = thumbnail(encode(scene(160, base)))
    assert similarity(reference, reference) == 1.0
    assert similarity(reference, flicker) == 1.0
    assert 0.9 < similarity(reference, moved) < 0.99


def test_similarity_of_different_shapes_raises() -> None:
    """Thumbnails of different sizes cannot be compared."""
    with pytest.raises(ValueError):
        similarity(np.zeros((32, 32), np.float32), np.zeros((16, 16), np.float32))


def test_first_frame_is_always_kept() -> None:
    """With nothing to compare against, the first frame is kept with similarity 0."""
    thumb = thumbnail(encode(scene(0, background())))
    assert SimilarityFilter(0.0).check(thumb) == FilterDecision(keep=True, similarity=0.0)


def test_near_duplicates_are_dropped_and_changes_kept() -> None:
    """A re-encoded noisy copy of the last kept frame is dropped; a changed scene is kept."""
    base = background()
    filt = SimilarityFilter(DEFAULT_THRESHOLD)
    assert filt.check(thumbnail(encode(scene(100, base)))).keep
    for seed in range(5):
        decision = filt.check(thumbnail(encode(scene(100, base, gain=1.03, noise=3.0, seed=seed))))
        assert not decision.keep and decision.similarity == 1.0
    assert filt.check(thumbnail(encode(scene(200, base)))).keep
    assert (filt.kept_total, filt.dropped_total) == (2, 5)


def test_higher_threshold_keeps_more(moving_thumbs: list[np.ndarray]) -> None:
    """The number of kept frames never falls as the threshold rises, from few to all."""
    thresholds = [0.0, 0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 1.0]
    counts = [kept(t, moving_thumbs) for t in thresholds]
    assert counts == sorted(counts)
    assert counts[0] < counts[-1] == len(moving_thumbs)


def test_default_threshold_keeps_moving_footage(panning_thumbs: list[np.ndarray]) -> None:
    """At the default threshold most frames of a panning camera are kept."""
    assert kept(DEFAULT_THRESHOLD, panning_thumbs) >= 0.8 * len(panning_thumbs)


def test_default_threshold_drops_a_still_camera() -> None:
    """At the default threshold a still, noisy, flickering camera sends only its first frame."""
    base = background()
    thumbs = [thumbnail(encode(scene(100, base, gain=1 + 0.02 * (i % 3), noise=3.0, seed=i))) for i in range(10)]
    assert kept(DEFAULT_THRESHOLD, thumbs) == 1


def test_threshold_one_keeps_even_exact_duplicates() -> None:
    """Similarity never exceeds 1, so threshold 1.0 keeps every frame."""
    thumb = thumbnail(encode(scene(0, background())))
    filt = SimilarityFilter(1.0)
    assert all(filt.check(thumb).keep for _ in range(3))


def test_slow_change_accumulates_until_a_frame_is_kept() -> None:
    """Comparing with the last kept frame, a slow drift is eventually let through."""
    base = background()
    thumbs = [thumbnail(encode(scene(100 + x, base))) for x in range(0, 40, 2)]
    consecutive = [similarity(a, b) for a, b in pairwise(thumbs)]
    threshold = min(consecutive) - 1e-6
    assert threshold < 1.0
    filt = SimilarityFilter(threshold)
    decisions = [filt.check(t) for t in thumbs]
    # Each step alone would be dropped, yet later frames are kept once change adds up.
    assert all(s > threshold for s in consecutive)
    assert sum(d.keep for d in decisions[1:]) >= 1


def test_disabled_filter_keeps_every_frame_and_reports_similarity() -> None:
    """A disabled filter keeps duplicates but still says how similar they were."""
    thumb = thumbnail(encode(scene(0, background())))
    filt = SimilarityFilter(0.5, enabled=False)
    filt.check(thumb)
    decision = filt.check(thumb)
    assert decision.keep and decision.similarity == 1.0


def test_reset_makes_the_next_frame_kept() -> None:
    """After reset the filter forgets its reference and keeps the next frame."""
    thumb = thumbnail(encode(scene(0, background())))
    filt = SimilarityFilter(0.5)
    filt.check(thumb)
    assert not filt.check(thumb).keep
    filt.reset()
    assert filt.check(thumb).keep


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_threshold_outside_zero_to_one_is_refused(threshold: float) -> None:
    """Thresholds are a share in 0..1."""
    with pytest.raises(ValueError):
        SimilarityFilter(threshold)


def plain(rgb: tuple[float, float, float], *, gain: float = 1.0, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """A frame of one colour (float RGB 0..255), optionally scaled and noisy."""
    pixels = np.empty((HEIGHT, WIDTH, 3), np.float32)
    pixels[:] = np.asarray(rgb, np.float32) * gain
    if noise:
        pixels += np.random.default_rng(seed).normal(0.0, noise, pixels.shape)
    return pixels


#: vLLM-Omni's example streaming client's synthetic frames: frame i is plain (37i, 73i, 113i) mod 256.
OMNI_COLOURS = [((i * 37) % 256, (i * 73) % 256, (i * 113) % 256) for i in range(10)]


@pytest.mark.parametrize("threshold", [0.95, DEFAULT_THRESHOLD])
def test_plain_frames_of_different_colours_are_all_kept(threshold: float) -> None:
    """Ten plain frames of ten colours are ten changes, at vLLM-Omni's threshold and the default."""
    filt = SimilarityFilter(threshold)
    decisions = [filt.check(thumbnail(encode(plain(colour)))) for colour in OMNI_COLOURS]
    assert all(d.keep for d in decisions)
    assert all(d.similarity == 0.0 for d in decisions[1:])
    primaries = [(255, 0, 0), (0, 0, 255), (0, 255, 0), (255, 255, 0), (255, 255, 255), (0, 0, 0)]
    filt = SimilarityFilter(threshold)
    assert all(filt.check(thumbnail(encode(plain(c)))).keep for c in primaries)


def test_the_same_plain_colour_twice_is_filtered() -> None:
    """A plain frame sent again (re-encoded, noisy, flickering a little) is a near-duplicate."""
    filt = SimilarityFilter(DEFAULT_THRESHOLD)
    assert filt.check(thumbnail(encode(plain((200, 40, 40))))).keep
    for seed, gain in enumerate([1.0, 0.92, 1.08, 0.96]):
        again = thumbnail(encode(plain((200, 40, 40), gain=gain, noise=4.0, seed=seed)))
        decision = filt.check(again)
        assert not decision.keep and decision.similarity == 1.0
    assert (filt.kept_total, filt.dropped_total) == (1, 4)


def test_a_brightness_step_of_a_plain_frame_is_a_change() -> None:
    """A plain grey frame turned brighter or darker is kept; a textured scene's steps are too."""
    filt = SimilarityFilter(DEFAULT_THRESHOLD)
    assert filt.check(thumbnail(encode(plain((90, 90, 90))))).keep
    assert filt.check(thumbnail(encode(plain((170, 170, 170))))).keep
    assert filt.check(thumbnail(encode(plain((90, 90, 90))))).keep
    base = background()
    scene_filter = SimilarityFilter(DEFAULT_THRESHOLD)
    assert scene_filter.check(thumbnail(encode(scene(100, base, gain=0.5)))).keep
    assert scene_filter.check(thumbnail(encode(scene(100, base, gain=1.0)))).keep


def pillow_thumbnail_of(image: np.ndarray, side: int = 32) -> np.ndarray:
    """The thumbnail as Pillow made it from a decoded frame: a nearest 4 side grid, box-averaged
    (the whole picture box-averaged when a side is at most 4 side)."""
    picture = Image.fromarray(image)
    if min(picture.size) > 4 * side:
        picture = picture.resize((4 * side, 4 * side), Image.Resampling.NEAREST)
    return np.asarray(picture.resize((side, side), Image.Resampling.BOX), dtype=np.float32) / np.float32(255.0)


def test_thumbnail_of_a_decoded_frame_matches_pillows() -> None:
    """The numpy thumbnail of a decoded frame (footage, and pictures small enough to be averaged
    whole) is within 1.5% of Pillow's, and judges footage the same."""
    footage = [decode_image(base64.b64decode(frame), None) for frame in load_footage(12)]
    small = [footage[0][:100, :90].copy(), footage[0][:300, :50].copy(), footage[0][:20, :30].copy()]
    for image in footage + small:
        thumb = thumbnail_of(image)
        assert thumb.shape == (32, 32, 3) and thumb.dtype == np.float32
        assert float(np.abs(thumb - pillow_thumbnail_of(image)).max()) < 0.015
    ours = [similarity(thumbnail_of(a), thumbnail_of(b)) for a, b in pairwise(footage)]
    pillows = [similarity(pillow_thumbnail_of(a), pillow_thumbnail_of(b)) for a, b in pairwise(footage)]
    assert np.allclose(ours, pillows, atol=0.02)
