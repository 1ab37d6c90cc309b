"""Latency figures as the benchmarks print them: nearest-rank percentiles over one run."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def spread(values: Sequence[float]) -> str:
    """``values`` (ms) as ``p50 A ms, p99 B ms, max C ms``."""
    return (f"p50 {percentile(values, 0.5):.1f} ms, p99 {percentile(values, 0.99):.1f} ms, "
            f"max {max(values, default=float('nan')):.1f} ms")
