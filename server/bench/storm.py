"""``livesight bench storm``: what a reconnect storm does to a session already streaming.

A probe session streams bikes.mp4 frames (640x480 JPEG), one at a time: it sends a frame,
waits for its ack, pauses 20 ms, and so on. Meanwhile ``sessions`` more connections open at
once (WebSocket handshake, ``session.config``, ``session.ready``), stay a second, then close at
once. Printed per round: the probe's ack latency while nothing else happens (the baseline,
same run), during the open storm and during the close storm, the storms' durations, and the
worst storm ack as a ratio of the baseline's median.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

from server.background import serve_process
from server.bench.footage import load_footage
from server.bench.served import serve_args
from server.client.connection import Connection

CONFIG = {"prefix_warmup": False, "num_frames": 2}
#: After a storm's last open or close, the probe's acks still count towards it for this long.
SETTLE_S = 0.1


@dataclass
class Probe:
    """The probe's acks: (sent at, latency ms), ``time.perf_counter`` clock."""

    acks: list[tuple[float, float]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def between(self, start: float, end: float) -> list[float]:
        return sorted(latency for sent, latency in self.acks if start <= sent < end)


async def _probe(url: str, frames: list[str], probe: Probe) -> None:
    conn, _ = await Connection.open(url, CONFIG, compression=None)
    try:
        n = 0
        while not probe.stop.is_set():
            sent = time.perf_counter()
            await conn.send_frame(frames[n % len(frames)], frame_id=n)
            await conn.wait_acks(1)
            probe.acks.append((sent, (time.perf_counter() - sent) * 1000))
            n += 1
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


def _describe(latencies: list[float]) -> str:
    if not latencies:
        return "no acks"
    return f"{len(latencies)} acks, median {statistics.median(latencies):.1f} ms, worst {latencies[-1]:.1f} ms"


async def _round(url: str, frames: list[str], sessions: int) -> str:
    probe = Probe()
    task = asyncio.create_task(_probe(url, frames, probe))
    await asyncio.sleep(1.0)
    opening = time.perf_counter()
    conns = await asyncio.gather(*[Connection.open(url, CONFIG, compression=None, open_timeout=120) for _ in range(sessions)])
    opened = time.perf_counter()
    await asyncio.sleep(1.0)
    closing = time.perf_counter()
    await asyncio.gather(*[conn.close() for conn, _ in conns])
    closed = time.perf_counter()
    await asyncio.sleep(0.5)
    probe.stop.set()
    await task
    quiet = probe.between(0, opening)
    during_open = probe.between(opening, opened + SETTLE_S)
    during_close = probe.between(closing, closed + SETTLE_S)
    base = statistics.median(quiet) if quiet else float("nan")
    worst = max(during_open[-1:] + during_close[-1:], default=float("nan"))
    return (
        f"  quiet: {_describe(quiet)}\n"
        f"  {sessions} opening at once ({(opened - opening) * 1000:.0f} ms): {_describe(during_open)}\n"
        f"  {sessions} closing at once ({(closed - closing) * 1000:.0f} ms): {_describe(during_close)}\n"
        f"  worst storm ack / quiet median: {worst / base:.1f}x"
    )


def run_storm(model: str | None, sessions: int, rounds: int) -> str:
    """Serve ``model`` (default: the demo model) and run ``rounds`` storms of ``sessions``."""
    args = serve_args(model, "--max-sessions", str(sessions + 8), "--max-pending-connections", str(sessions + 8))
    frames = load_footage(20)
    lines = [f"a probe streaming 640x480 JPEG while {sessions} sessions open at once, then close at once"]
    with serve_process(args) as served:
        asyncio.run(_round(served.ws_url, frames, min(sessions, 10)))  # first-use costs
        for n in range(rounds):
            lines += [f"round {n + 1}:", asyncio.run(_round(served.ws_url, frames, sessions))]
    return "\n".join(lines)
