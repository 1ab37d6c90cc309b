"""Reading a camera the server pulls itself: RTSP (TCP or UDP), HLS, HTTP MJPEG or a local file
(optionally looped), through PyAV/FFmpeg, in a thread of its own.

``read_source`` opens the source, decodes its video and hands ``sampled`` frames to ``put``:
one per ``1 / fps`` of the stream's own time (``webrtc.media.Sampler``), each scaled to at
most ``max_side`` and encoded as JPEG; the frames a sample needs (its keyframe and those
between) are decoded but never converted, and the others not even decoded (``GopSkip``). A file or HTTP feed is paced at its own rate (it plays as a camera would); a file
starts over at its end when looped. FFmpeg's own timeouts bound the open and every read, so a camera that
never answers or stops sending raises ``SourceError`` instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from server.webrtc.media import Sampler, frame_jpeg

#: The URL schemes a stream's source may have.
SCHEMES = frozenset({"rtsp", "rtsps", "http", "https", "file"})


class SourceError(Exception):
    """The source failed. ``final``: it is not a camera (or not one this server can read), so
    trying again cannot help."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


@dataclass(frozen=True, slots=True)
class SourceFrame:
    """A sampled frame: its JPEG and its time in the source (ms since the source's first frame)."""

    jpeg: bytes
    pts_ms: float


@dataclass(slots=True)
class SourceCounts:
    """Frames a stream's source gave: decoded, and sampled (handed on)."""

    decoded: int = 0
    sampled: int = 0
    skipped: int = 0  # packets no sampled frame needed, never decoded


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where a stream's frames come from and how to read them."""

    url: str
    fps: float
    max_side: int
    loop: bool = False
    open_timeout_s: float = 10.0
    read_timeout_s: float = 5.0

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()


def checked_url(url: str) -> str:
    """``url`` if its scheme is one a stream may read (a path without one is refused: the
    file scheme says it is meant). Raises ``ValueError``."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"a source is an rtsp://, http(s):// or file:// URL, not {url[:80]!r}")
    if parts.scheme.lower() != "file" and not parts.hostname:
        raise ValueError("the source URL names no host")
    return url


def _opened(spec: SourceSpec) -> tuple[str, dict[str, str], str | None]:
    """The URL FFmpeg opens, its options and its format. RTSP takes ``?transport=udp`` (TCP by
    default: it crosses NATs and loses nothing)."""
    parts = urlsplit(spec.url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return str(Path(parts.path)), {}, None
    options: dict[str, str] = {}
    url = spec.url
    if scheme in ("rtsp", "rtsps"):
        query = parse_qs(parts.query)
        transport = (query.pop("transport", ["tcp"])[0] or "tcp").lower()
        options["rtsp_transport"] = "udp" if transport == "udp" else "tcp"
        rest = "&".join(f"{k}={v}" for k, values in query.items() for v in values)
        url = urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment))
    else:
        options["reconnect"] = "0"  # the stream reconnects itself, with its backoff
    return url, options, None


def read_source(spec: SourceSpec, put: Callable[[SourceFrame], None], stop: threading.Event,
                on_open: Callable[[], None] = lambda: None, counts: SourceCounts | None = None) -> None:
    """Read ``spec`` until ``stop`` is set or the source ends (a file not looped). Calls
    ``on_open`` once frames can come, ``put`` with each sampled frame. Raises ``SourceError``."""
    import av

    url, options, fmt = _opened(spec)
    sampler = Sampler(spec.fps)
    counts = counts if counts is not None else SourceCounts()
    offset_s = 0.0  # a looped file's time goes on across its runs
    while not stop.is_set():
        began = time.monotonic()
        try:
            container = av.open(url, options=options, format=fmt,
                                timeout=(spec.open_timeout_s, spec.read_timeout_s))
        except (av.error.InvalidDataError, av.error.PatchWelcomeError, av.error.ProtocolNotFoundError) as exc:
            if time.monotonic() - began >= spec.open_timeout_s * 0.9:  # FFmpeg says a timeout so too
                raise SourceError(f"the source did not answer within {spec.open_timeout_s:g} s") from None
            raise SourceError(f"not a video source: {exc}", final=True) from None
        except (av.error.HTTPNotFoundError, av.error.FileNotFoundError) as exc:
            raise SourceError(f"no such source: {exc}", final=True) from None
        except (av.error.FFmpegError, OSError) as exc:
            raise SourceError(f"could not open the source: {exc}") from None
        try:
            end_s = _decode(container, spec, sampler, offset_s, put, stop, on_open, counts)
        finally:
            container.close()
        if stop.is_set() or (spec.scheme == "file" and not spec.loop):
            return  # stopped, or a file played once
        if spec.scheme != "file":
            raise SourceError("the source ended")  # a camera that stops sending: reconnect
        offset_s = end_s


class GopSkip:
    """Which packets of a video need decoding for the sampled frames. A frame needs its
    keyframe and every frame between; so a keyframe is decoded when the next one is not due
    before the next sample (each keyframe's interval is learnt from the packets, the longest
    of the last few), and after a sample the frames up to the next keyframe are skipped when
    that keyframe comes before the next sample. At 2 fps, a camera with a keyframe every
    0.5 s has only its keyframes decoded; one every second, about half its frames. Packets
    without times are all decoded."""

    KEPT_INTERVALS = 4

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.last_key: float | None = None
        self.intervals: deque[float] = deque(maxlen=self.KEPT_INTERVALS)
        self.decoding = True

    @property
    def gop(self) -> float | None:
        return max(self.intervals) if self.intervals else None

    def need(self, at_s: float | None, key: bool) -> bool:
        if at_s is None:
            return True
        due, gop = self.sampler.next_due, self.gop
        if key:
            if self.last_key is not None and at_s > self.last_key:
                self.intervals.append(at_s - self.last_key)
            self.last_key = at_s
            if due is not None and gop is not None and at_s + gop <= due - 1e-3:
                self.decoding = False  # another keyframe comes before the sample
                return False
            self.decoding = True
        return self.decoding

    def sampled(self) -> None:
        """A frame was kept: skip to the next keyframe if it comes before the next sample."""
        due, gop = self.sampler.next_due, self.gop
        if due is not None and gop is not None and self.last_key is not None and self.last_key + gop <= due + 1e-3:
            self.decoding = False


def _decode(container: object, spec: SourceSpec, sampler: Sampler, offset_s: float,
            put: Callable[[SourceFrame], None], stop: threading.Event, on_open: Callable[[], None],
            counts: SourceCounts) -> float:
    """Decode one run of an open container; returns the source time it ended at (seconds)."""
    import av

    if not container.streams.video:  # type: ignore[attr-defined]
        raise SourceError("the source has no video", final=True)
    stream = container.streams.video[0]  # type: ignore[attr-defined]
    stream.codec_context.skip_frame = "NONREF"  # frames no other frame needs are not decoded
    stream.thread_type = "NONE"  # one thread a stream: many streams share the cores better than threads per frame
    # A file or an HTTP feed (an HLS playlist, MJPEG) plays at its own rate, as a camera
    # would: neither may run ahead of the wall clock. RTSP is live by nature.
    paced = spec.scheme not in ("rtsp", "rtsps")
    started = time.monotonic()
    first: float | None = None
    last_s = offset_s
    on_open()
    skip = GopSkip(sampler)
    try:
        for frame in _frames(container, stream, skip, counts, offset_s):
            if stop.is_set():
                break
            counts.decoded += 1
            # a feed without timestamps (MJPEG over HTTP) is timed by its arrival
            stamp = frame.time if frame.time is not None else time.monotonic() - started
            first = stamp if first is None else first
            at_s = offset_s + stamp - first
            last_s = at_s
            if paced:  # a file plays at its own rate, as a camera would
                ahead = (at_s - offset_s) - (time.monotonic() - started)
                if ahead > 0 and stop.wait(ahead):
                    break
            if sampler.keep(at_s):
                counts.sampled += 1
                skip.sampled()
                put(SourceFrame(frame_jpeg(frame, spec.max_side), round(at_s * 1000, 3)))
    except (av.error.FFmpegError, OSError) as exc:
        if not stop.is_set():
            raise SourceError(f"reading the source failed: {exc}") from None
    rate = float(stream.average_rate or 25)
    return last_s + 1.0 / rate


def _frames(container: Any, stream: Any, skip: GopSkip, counts: SourceCounts, offset_s: float) -> Iterator[Any]:
    """The decoded frames of ``stream``, its packets that no sampled frame needs left undecoded
    (counted in ``counts.skipped``). Packet times are taken on the sampler's clock: from the
    first packet's, plus ``offset_s``."""
    first: float | None = None
    for packet in container.demux(stream):
        if packet.size == 0:  # the demuxer's end: flush the decoder
            yield from packet.decode()
            continue
        at_s = None
        if packet.pts is not None and packet.time_base is not None:
            t = float(packet.pts * packet.time_base)
            first = t if first is None else first
            at_s = offset_s + t - first
        if not skip.need(at_s, packet.is_keyframe):
            counts.skipped += 1
            continue
        yield from packet.decode()
