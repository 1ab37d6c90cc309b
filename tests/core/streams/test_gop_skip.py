"""Which packets of a camera's video a stream decodes (``server/streams/source.py``'s
``GopSkip``), alone: a sampled frame needs its keyframe and the frames between, nothing else."""

from __future__ import annotations

from server.streams.source import GopSkip
from server.webrtc.media import Sampler


def _decoded(fps: float, rate: float, gop_s: float, seconds: float) -> tuple[list[float], list[float]]:
    """Packets at ``rate`` a second with a keyframe every ``gop_s``, sampled at ``fps``: the
    times decoded and the times kept (a decoded frame the sampler keeps)."""
    sampler = Sampler(fps)
    skip = GopSkip(sampler)
    decoded, kept = [], []
    per_gop = round(gop_s * rate)
    for n in range(round(seconds * rate)):
        at = n / rate
        if skip.need(at, n % per_gop == 0):
            decoded.append(at)
            if sampler.keep(at):
                kept.append(at)
                skip.sampled()
    return decoded, kept


def test_a_keyframe_every_sample_interval_decodes_only_the_keyframes() -> None:
    """24 fps, a keyframe every 0.5 s, sampled at 2 fps: once the interval is learnt, only
    keyframes are decoded, and every sample is one."""
    decoded, kept = _decoded(2, 24, 0.5, 10)
    assert all(round(t * 24) % 12 == 0 for t in decoded if t >= 1.0)
    assert len([t for t in decoded if t >= 1.0]) == 18
    assert kept == [n / 2 for n in range(20)]


def test_a_keyframe_a_second_decodes_about_half_and_misses_no_sample() -> None:
    """A keyframe a second at 2 fps: the frames after the second sample of each second are
    skipped (about half); samples still come every half second."""
    decoded, kept = _decoded(2, 25, 1.0, 10)
    assert 25 * 10 * 0.4 < len(decoded) < 25 * 10 * 0.7, len(decoded)
    assert len(kept) == 20 and max(b - a for a, b in zip(kept, kept[1:], strict=False)) < 0.6


def test_packets_without_times_are_all_decoded() -> None:
    """A feed without timestamps (MJPEG over HTTP) gives no times to plan with: all decoded."""
    skip = GopSkip(Sampler(2))
    assert all(skip.need(None, n % 5 == 0) for n in range(50))
