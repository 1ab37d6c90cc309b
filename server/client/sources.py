"""Frame sources for ``livesight stream``: the pictures of a video file (decoded with PyAV)
or of an image folder, each with its time in the source, and their JPEG encoding."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp"})


@dataclass(frozen=True)
class SourceFrame:
    """One picture of a source and its time in seconds from the source's start."""

    pts_s: float
    image: Image.Image


def video_frames(path: Path, fps: float) -> Iterator[SourceFrame]:
    """Decode a video file with PyAV at its own rate, keeping about ``fps`` frames a second
    (every frame when ``fps`` <= 0). Raises ``av.FFmpegError`` for an unreadable file."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        rate = float(stream.average_rate or 25)
        origin: float | None = None
        next_sample = 0.0
        for index, frame in enumerate(container.decode(stream)):
            t = frame.time if frame.time is not None else index / rate
            origin = t if origin is None else origin
            t -= origin
            if fps > 0 and t < next_sample - 1e-6:
                continue
            if fps > 0:
                next_sample = (int(t * fps + 1e-6) + 1) / fps
            yield SourceFrame(round(t, 6), frame.to_image())


def folder_frames(path: Path, fps: float) -> Iterator[SourceFrame]:
    """The images of a folder in name order, one every ``1/fps`` seconds of video time."""
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{path} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    step = 1 / fps if fps > 0 else 1.0
    for index, file in enumerate(files):
        with Image.open(file) as image:
            yield SourceFrame(round(index * step, 6), image.convert("RGB"))


def open_source(path: Path, fps: float) -> Iterator[SourceFrame]:
    """Frames of a video file or an image folder. Raises ``FileNotFoundError``, ``ValueError``."""
    if path.is_dir():
        return folder_frames(path, fps)
    if not path.is_file():
        raise FileNotFoundError(f"no such file or folder: {path}")
    return video_frames(path, fps)


def encode_jpeg(image: Image.Image, quality: int = 80, max_side: int = 640) -> bytes:
    """JPEG bytes of ``image``, scaled down so its longest side is at most ``max_side`` (0: as is)."""
    if max_side > 0 and max(image.size) > max_side:
        scale = max_side / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()
