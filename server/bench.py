"""``livesight bench ttft``: time to first output with and without a warm prefix.

Starts the real server (tiny demo model unless ``--model`` is given), and for each frame
count N opens a session, buffers N distinct frames, waits until the server is idle (decodes
and warmup done), then times a few queries. Both modes use the same N frames in the prompt,
so the only difference is whether the prefix was prefilled while the camera was watching.
"""

from __future__ import annotations

import asyncio
import base64
import io
import statistics
import time
from dataclasses import dataclass

import httpx
import numpy as np
from PIL import Image

from handlers.protocol import UsageInfo
from server.background import RunningServer, run_server, serve_process
from server.connection import Connection
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


def bench_frame(i: int, size: tuple[int, int] = (320, 240)) -> str:
    """A distinct, JPEG-encoded, base64 frame."""
    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    return base64.b64encode(buf.getvalue()).decode()


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 600) -> None:
    """Wait until no session has a decode, warmup or answer running. Raises ``TimeoutError``."""
    deadline = time.monotonic() + timeout_s
    while (await http.get("/metrics.json")).json()["sessions_busy"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not settle")
        await asyncio.sleep(0.02)


async def measure(server: RunningServer, frames: int, warm: bool, queries: int) -> Sample:
    """Buffer ``frames`` frames in a new session and time ``queries`` questions."""
    config = {
        "prefix_warmup": warm, "enable_frame_filter": False,
        "max_frames": max(frames, 1), "num_frames": min(max(frames, 1), 128),
        "sampling": {"temperature": 0, "max_tokens": 2}, "frame_timestamps": True,
    }
    ttfts, server_ttfts, usage = [], [], UsageInfo()
    conn, _ = await Connection.open(server.ws_url, config)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        try:
            for i in range(frames):
                await conn.send_frame(bench_frame(i), frame_id=i, pts_ms=i * 500)
            await conn.wait_acks(frames)
            for q in range(queries):
                await wait_idle(http)
                answer = await conn.ask_timed(f"what changed? ({q})")
                ttfts.append(answer.first_output_ms)
                server_ttfts.append(answer.done.timings.ttft_ms)
                usage = answer.done.usage
        finally:
            await conn.close()
    return Sample(frames, warm, ttfts, server_ttfts, usage.cached_tokens, usage.prompt_tokens)


def render(samples: list[Sample]) -> str:
    """The result table, with warm/cold and warm(N)/warm(1) ratios."""
    by = {(s.frames, s.warm): s for s in samples}
    counts = sorted({s.frames for s in samples})
    warm1 = by[(counts[0], True)].median
    lines = [
        "frames  prompt_tok  warm_ttft_ms  cached_tok  cold_ttft_ms  cold/warm  warm/warm@%d" % counts[0],
    ]
    for n in counts:
        w, c = by[(n, True)], by[(n, False)]
        lines.append(
            f"{n:6d}  {w.prompt_tokens:10d}  {w.median:12.1f}  {w.cached_tokens:10d}  {c.median:12.1f}"
            f"  {c.median / w.median:8.1f}x  {w.median / warm1:11.2f}x"
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
    settings = Settings(model=model, port=0, max_queue=max(counts) + 16)
    with run_server(settings) as server:
        asyncio.run(measure(server, 2, True, 1))  # warm the model itself (first-call costs)
        samples = asyncio.run(_run_all(server, counts, queries))
    return render(samples)


# ---------------------------------------------------------------------- intake cost


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _moving_frames(count: int, size: tuple[int, int]) -> list[str]:
    """Distinct 640x480-style JPEGs (~60 KB): a textured scene with a moving block."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    scene = np.asarray(Image.fromarray(base).resize(size, Image.BICUBIC))
    noise = rng.integers(0, 40, (size[1], size[0], 3), dtype=np.uint8)
    out = []
    for i in range(count):
        frame = scene.copy() // 2 + noise // 2
        x = (i * 37) % (size[0] - 120)
        frame[100:220, x : x + 120] = (255 - 3 * i) % 255
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, "JPEG", quality=85)
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


async def _send_frames(url: str, frames: list[str], warm: bool) -> int:
    conn, _ = await Connection.open(url, {"prefix_warmup": warm, "max_frames": 256, "enable_frame_filter": False})
    try:
        for i, data in enumerate(frames):
            await conn.send_frame(data, frame_id=i)
        return sum(ack.accepted for ack in await conn.wait_acks(len(frames)))
    finally:
        await conn.close()


def run_intake(model: str | None, count: int) -> str:
    """CPU milliseconds the server process spends per accepted 640x480 frame."""
    # A burst of frames is sent at once: no load shedding, so every frame's cost is measured.
    args = ["--log-level", "warning", "--intake-max-wait-ms", "600000", "--max-queue", str(count + 16)]
    if model:
        args += ["--model", model]
    with serve_process(args) as served:
        proc, base, url = served.proc, served.http_url, served.ws_url
        frames = _moving_frames(count, (640, 480))
        size_kb = statistics.mean(len(f) * 3 / 4 / 1024 for f in frames)
        lines = [f"{count} frames, 640x480 JPEG, mean {size_kb:.0f} KB"]
        asyncio.run(_send_frames(url, frames[:4], False))  # first-call costs
        for warm in (False, True):
            cpu0, wall0 = _process_cpu_s(proc.pid), time.perf_counter()
            accepted = asyncio.run(_send_frames(url, frames, warm))

            async def settle() -> None:
                async with httpx.AsyncClient(base_url=base) as http:
                    await wait_idle(http)

            asyncio.run(settle())
            cpu = _process_cpu_s(proc.pid) - cpu0
            wall = time.perf_counter() - wall0
            label = "intake+decode+warm prefill" if warm else "intake+decode (no warmup)"
            lines.append(f"{label:28s}: {1000 * cpu / accepted:6.2f} ms CPU per accepted frame "
                         f"({accepted} accepted, {wall:.1f} s wall)")
        return "\n".join(lines)
