"""Camera-like frames of one dominant colour, for training and checking the colours model.

A frame is a scene: a background of one named colour (a gradient between two shades of it,
with soft blotches and pixel noise) and a few small objects of other colours that move from
frame to frame. The named colour covers most of the picture (objects take at most
``MAX_OBJECT_AREA`` of it), so "the colour of the screen" is well defined. Frames are
JPEG-compressed at a random quality and decoded the way the server decodes a client's JPEG
for the model (``handlers.media.decoder.decode_jpeg`` at the model's image side), so what the
model is trained and checked on is what it sees in a session.

Everything is drawn from a ``numpy.random.Generator``: the same seed gives the same frames.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import simplejpeg
from PIL import Image, ImageDraw

from handlers.media.decoder import decode_jpeg

COLOURS = ("red", "green", "blue", "yellow", "white", "black", "grey")

# Each colour's shades: per channel (low, high) of the background's base RGB. The ranges are
# far apart, so a frame's colour is never in doubt, yet wide enough to look like real screens.
_SHADES = {
    "red": ((165, 255), (0, 70), (0, 70)),
    "green": ((0, 90), (135, 255), (0, 90)),
    "blue": ((0, 70), (0, 100), (145, 255)),
    "yellow": ((215, 255), (190, 245), (0, 80)),
    "white": ((220, 255), (220, 255), (220, 255)),
    "black": ((0, 40), (0, 40), (0, 40)),
    "grey": ((95, 165), (95, 165), (95, 165)),
}
_GREY_LEVELS = {"white", "black", "grey"}  # channels kept within a few steps of each other
_GREY_SPREAD = 8

# Frame sizes (width, height) a camera or a client's scaling sends: 4:3, 16:9, square,
# portrait, CIF, ultra-wide. Half of the frames take one of these, the rest a random size.
CAMERA_SIZES = (
    (160, 120), (176, 144), (320, 240), (320, 180), (352, 288), (424, 240), (480, 360), (640, 360),
    (640, 480), (800, 600), (960, 540), (1024, 768), (1280, 720), (240, 320), (360, 640), (480, 480),
    (720, 1280), (1280, 540),
)
_RANDOM_SIDES = (96, 1280)
_RANDOM_ASPECTS = (0.5, 2.4)  # width / height

MAX_OBJECTS = 4
MAX_OBJECT_AREA = 0.2  # all objects together, as a fraction of the frame
_DRAW_SIDE = 256  # a frame is drawn at most this large, then scaled up to its size
_NOISE_TILE = 128


@dataclass(frozen=True)
class ColourFrame:
    """One frame: what the client sends (``jpeg``, ``size`` = width, height) and the pixels
    the server hands the model's processor (``pixels``, H x W x 3 uint8 RGB)."""

    colour: str
    jpeg: bytes
    size: tuple[int, int]
    pixels: np.ndarray

    @property
    def key(self) -> str:
        """The frame's content key, as the server computes it: SHA-256 of the JPEG, 32 hex digits."""
        return hashlib.sha256(self.jpeg).hexdigest()[:32]


@dataclass(frozen=True)
class _Shape:
    """A small object: an ellipse or rectangle, its colour, where it starts and how it moves
    (fractions of the frame per frame)."""

    ellipse: bool
    rgb: tuple[int, int, int]
    centre: tuple[float, float]
    half: tuple[float, float]
    velocity: tuple[float, float]


def random_size(rng: np.random.Generator) -> tuple[int, int]:
    """A camera frame size (width, height): a common one or a random one of any aspect."""
    if rng.random() < 0.5:
        return CAMERA_SIZES[int(rng.integers(len(CAMERA_SIZES)))]
    aspect = float(np.exp(rng.uniform(*np.log(_RANDOM_ASPECTS))))
    longest = int(np.exp(rng.uniform(*np.log(_RANDOM_SIDES))))
    if aspect >= 1:
        return longest, max(32, round(longest / aspect))
    return max(32, round(longest * aspect)), longest


def shade(rng: np.random.Generator, colour: str) -> np.ndarray:
    """A random RGB shade (float32, 0-255) of ``colour``."""
    low, high = np.array(_SHADES[colour], dtype=np.float32).T
    if colour in _GREY_LEVELS:
        level = rng.uniform(low[0], high[0])
        return np.clip(level + rng.uniform(-_GREY_SPREAD, _GREY_SPREAD, 3), low, high).astype(np.float32)
    return rng.uniform(low, high).astype(np.float32)


class ColourScene:
    """A camera looking at a screen: its size, its small moving objects and noise texture.
    ``frame(colour, t)`` draws the scene at frame ``t`` with the screen in ``colour``."""

    def __init__(self, rng: np.random.Generator, size: tuple[int, int] | None = None) -> None:
        self.rng = rng
        self.size = size or random_size(rng)
        self.quality = int(rng.integers(40, 96))
        self.noise = float(rng.uniform(0, 22))
        self._tile = rng.normal(0, 1, (_NOISE_TILE, _NOISE_TILE, 3)).astype(np.float32)
        self.shapes = self._shapes()

    def _shapes(self) -> list[_Shape]:
        rng = self.rng
        shapes = []
        room = MAX_OBJECT_AREA
        for _ in range(int(rng.integers(0, MAX_OBJECTS + 1))):
            area = min(room, float(rng.uniform(0.005, 0.07)))
            if area < 0.004:
                break
            room -= area
            aspect = float(rng.uniform(0.5, 2.0))
            half = (np.sqrt(area * aspect) / 2, np.sqrt(area / aspect) / 2)
            rgb = tuple(int(v) for v in rng.integers(0, 256, 3))
            if rng.random() < 0.6:
                rgb = tuple(int(v) for v in shade(rng, COLOURS[int(rng.integers(len(COLOURS)))]))
            shapes.append(_Shape(
                ellipse=bool(rng.random() < 0.5), rgb=rgb,
                centre=(float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.1, 0.9))), half=half,
                velocity=(float(rng.uniform(-0.08, 0.08)), float(rng.uniform(-0.08, 0.08))),
            ))
        return shapes

    def frame(self, colour: str, t: int, max_side: int | None) -> ColourFrame:
        """The scene at frame ``t`` with the screen in ``colour``, JPEG-encoded and decoded as
        the server decodes it for a model whose image side is ``max_side``."""
        rng = self.rng
        width, height = self.size
        scale = min(1.0, _DRAW_SIDE / max(width, height))
        draw_size = (max(8, round(width * scale)), max(8, round(height * scale)))
        picture = Image.fromarray(self._background(colour, draw_size))
        draw = ImageDraw.Draw(picture)
        dw, dh = draw_size
        for s in self.shapes:
            cx = _bounce(s.centre[0] + s.velocity[0] * t)
            cy = _bounce(s.centre[1] + s.velocity[1] * t)
            box = ((cx - s.half[0]) * dw, (cy - s.half[1]) * dh, (cx + s.half[0]) * dw, (cy + s.half[1]) * dh)
            (draw.ellipse if s.ellipse else draw.rectangle)(box, fill=s.rgb)
        if self.noise > 0:  # sensor noise, drawn at the drawing size: a grain on frames larger than it
            oy, ox = (int(v) for v in rng.integers(0, _NOISE_TILE, 2))
            reps = (-(-(dh + oy) // _NOISE_TILE), -(-(dw + ox) // _NOISE_TILE), 1)
            grain = np.tile(self._tile, reps)[oy : oy + dh, ox : ox + dw]
            noisy = np.asarray(picture, dtype=np.float32) + self.noise * grain
            picture = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        if picture.size != self.size:
            picture = picture.resize(self.size, Image.BILINEAR)
        rgb = np.asarray(picture)
        jpeg = simplejpeg.encode_jpeg(rgb, quality=self.quality, colorspace="RGB", colorsubsampling="420")
        return ColourFrame(colour, jpeg, self.size, decode_jpeg(jpeg, self.size, max_side))

    def _background(self, colour: str, size: tuple[int, int]) -> np.ndarray:
        """A gradient between two shades of ``colour`` with soft blotches (uint8, H x W x 3)."""
        rng = self.rng
        width, height = size
        angle = rng.uniform(0, 2 * np.pi)
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        along = np.cos(angle) * xs / width + np.sin(angle) * ys / height
        along = (along - along.min()) / max(float(np.ptp(along)), 1e-6)
        start, end = shade(rng, colour), shade(rng, colour)
        picture = start + (end - start) * along[..., None]
        blotches = rng.uniform(0.92, 1.06, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 1))
        blotches = np.asarray(
            Image.fromarray(blotches[..., 0].astype(np.float32)).resize(size, Image.BILINEAR)
        )[..., None]
        return np.clip(picture * blotches, 0, 255).astype(np.uint8)


def _bounce(x: float) -> float:
    """``x`` folded back into [0, 1], as an object bouncing off the frame's edges."""
    x = abs(x) % 2.0
    return 2.0 - x if x > 1.0 else x


def colour_clip(
    rng: np.random.Generator, colours: list[str], max_side: int | None, size: tuple[int, int] | None = None
) -> list[ColourFrame]:
    """Consecutive frames of one scene, the screen in ``colours[i]`` at frame ``i``."""
    scene = ColourScene(rng, size)
    start = int(rng.integers(0, 50))
    return [scene.frame(colour, start + i, max_side) for i, colour in enumerate(colours)]


def moving_clip(colours: list[str], size: tuple[int, int], seed: int) -> list[ColourFrame]:
    """A camera's clip at ``size``: one scene with moving objects and noise (so the similarity
    filter keeps every frame) whose screen takes ``colours``, frame by frame, as a client sends it."""
    rng = np.random.default_rng(seed)
    scene = ColourScene(rng, size)
    while len(scene.shapes) < 2 or scene.noise < 6:
        scene = ColourScene(rng, size)
    return [scene.frame(colour, t, None) for t, colour in enumerate(colours)]
