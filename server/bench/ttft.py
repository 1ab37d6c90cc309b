"""``livesight bench ttft``: time to first output with and without a warm prefix.

Starts the real server (tiny random-weight model unless ``--model`` is given), and for each frame
count N opens a session, buffers N distinct frames, waits until the server is idle (decodes
and warmup done), then times a few queries. Both modes use the same N frames in the prompt,
so the only difference is whether the prefix was prefilled while the camera was watching.
Each cold question is asked in a new session (a session's later questions find the earlier
ones' prompt cached); ``cold_cached`` is the most prompt tokens one of them found cached.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

import httpx

from handlers.wire.protocol import UsageInfo
from server.background import RunningServer, run_server
from server.bench.footage import bench_frame
from server.bench.served import bench_model, wait_idle
from server.client.connection import Connection
from server.settings import Settings


@dataclass
class Sample:
    frames: int
    warm: bool
    ttft_ms: list[float]
    server_ttft_ms: list[float]
    cached_tokens: int
    prompt_tokens: int

    @property
    def median(self) -> float:
        return statistics.median(self.ttft_ms)


async def measure(server: RunningServer, frames: int, warm: bool, queries: int) -> Sample:
    """Buffer ``frames`` frames in a new session and time ``queries`` questions. Cold
    (``warm`` False), each question is asked in a session of its own: a session's second
    question finds the first one's prompt cached (the prompt is the timeline), so it would
    not be a cold prefill."""
    config = {
        "prefix_warmup": warm, "enable_frame_filter": False,
        "max_frames": max(frames, 1), "num_frames": min(max(frames, 1), 128),
        "sampling": {"temperature": 0, "max_tokens": 2}, "frame_timestamps": True,
    }
    ttfts, server_ttfts, usage, cached = [], [], UsageInfo(), []
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for _ in range(1 if warm else queries):
            conn, _ = await Connection.open(server.ws_url, config)
            try:
                for i in range(frames):
                    await conn.send_frame(bench_frame(i), frame_id=i, pts_ms=i * 500)
                await conn.wait_acks(frames)
                for q in range(queries if warm else 1):
                    await wait_idle(http)
                    answer = await conn.ask_timed(f"what changed? ({q})")
                    ttfts.append(answer.first_output_ms)
                    server_ttfts.append(answer.done.timings.ttft_ms)
                    usage = answer.done.usage
                    cached.append(usage.cached_tokens)
            finally:
                await conn.close()
    # warm: what the last question found cached; cold: the most any question found
    return Sample(frames, warm, ttfts, server_ttfts, usage.cached_tokens if warm else max(cached),
                  usage.prompt_tokens)


def render(samples: list[Sample]) -> str:
    """The result table, with warm/cold and warm(N)/warm(1) ratios."""
    by = {(s.frames, s.warm): s for s in samples}
    counts = sorted({s.frames for s in samples})
    warm1 = by[(counts[0], True)].median
    lines = [
        "frames  prompt_tok  warm_ttft_ms  cached_tok  cold_ttft_ms  cold_cached  cold/warm  warm/warm@%d" % counts[0],
    ]
    for n in counts:
        w, c = by[(n, True)], by[(n, False)]
        lines.append(
            f"{n:6d}  {w.prompt_tokens:10d}  {w.median:12.1f}  {w.cached_tokens:10d}  {c.median:12.1f}"
            f"  {c.cached_tokens:11d}  {c.median / w.median:8.1f}x  {w.median / warm1:11.2f}x"
        )
    return "\n".join(lines)


async def _run_all(server: RunningServer, counts: list[int], queries: int) -> list[Sample]:
    samples = []
    for n in counts:
        for warm in (True, False):
            samples.append(await measure(server, n, warm, queries))
    return samples


def run_ttft(model: str | None, counts: list[int], queries: int) -> str:
    """Start a server, measure every frame count in both modes; returns the table."""
    settings = Settings(model=bench_model(model), port=0, max_queue=max(counts) + 16, idle_timeout_s=600)
    with run_server(settings) as server:
        asyncio.run(measure(server, 2, True, 1))  # warm the model itself (first-call costs)
        samples = asyncio.run(_run_all(server, counts, queries))
    return render(samples)
