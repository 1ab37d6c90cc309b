"""``livesight bench memory``: what a session's memory costs and finds over a stream-hour.

The server runs in its own process (``livesight serve``) on the shipped colours model, its memory
in SQLite in a temporary data directory (removed after) or in the database ``--memory-url`` names.
The client streams a scripted camera (``server.models.colour_frames``: texture, noise and small
moving objects) looking at a screen whose colour changes every 10 to 60 stream-seconds (a seeded
script; never the same colour twice in a row), as 2 fps of stream time.

The stream is compressed in time: frames are paced at ``speed`` times 2 per wall-second, each
sent once the one before it is acked, and the server's keyframe settings are divided by
``speed`` (``memory_keyframe_s`` 10 / speed, ``memory_min_keyframe_s`` 1 / speed), so the
moments kept (keyframes are taken on the server's receive clock) are the ones a real-time
stream would keep. The pacing achieved is read back from the acks' receive times and printed.
Sessions run with ``prefix_warmup`` off: compressed fifty-fold, warming the prefix at every frame
would keep the engine busy all the time (about 24 ms of server CPU a frame against 1.4 without),
which a real-time stream does not, and it would bury memory's share of the CPU in the engine's.
So no moment is captioned (captions are written on the warm prefix, in the engine's idle time).

A run: a short warm-up session; the same stream four times, memory off, on, off, on (the first
remembering session cleared after), the server process's CPU time (from /proc: the event loop,
its main thread, apart from the other threads) read from before each pass's first frame until
the server is idle and its memory writes done after the last ack; then on the last session that
remembered: the keyframes' bytes (``GET /v1/sessions/{id}/moments``) and the store's
``usage()``; ``RANGE_QUESTIONS`` questions about past scenes by ``range`` (does the answer name
the scene's colour?); text searches for the words those answers hold; the condition search
"Is the screen blue?" over the whole session (one search per run of ``SEARCH_LIMIT`` moments,
the most results a search returns), against the script (a moment is truly blue when the frame
at its start was); then ``memory.clear``.

The camera redraws the screen's shade at every frame (within its colour's range), so a shade
can jump far enough for the similarity thumbnail to see a scene change inside a scene; those
moments are counted apart, by colour.
"""

from __future__ import annotations

import asyncio
import base64
import math
import shutil
import statistics
import tempfile
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from handlers.wire.protocol import (
    MemoryClear,
    MemoryCleared,
    MemoryResults,
    MemorySearch,
    ResponseDone,
    ResponseTextDelta,
)
from server.background import ServerAddress, serve_process
from server.bench.latency import percentile
from server.bench.process import process_cpu_s, thread_cpu_s
from server.bench.served import wait_idle
from server.client.connection import Connection

FPS = 2.0
CAMERA = (320, 240)
SCENE_S = (10.0, 60.0)  # shortest and longest scene, stream-seconds
KEYFRAME_S, MIN_KEYFRAME_S = 10.0, 1.0  # the server's defaults, in stream time
DEFAULT_SPEED = 50.0
QUESTION = "What colour is the screen?"
CONDITION = "Is the screen blue?"
BLUE = "blue"
RANGE_QUESTIONS = 20
TEXT_SEARCHES = 9
MARGIN_S = 2.0  # a range question starts this long after its scene's first frame
WARMUP_FRAMES = 40
PASSES = 2  # the stream with memory off, then on, this many times
TARGET_BYTES_PER_HOUR = 50e6
TARGET_LOOP_MS = 0.3
TARGET_TEXT_MS = 50.0
#: After the last ack, an idle server and no memory write queued, the CPU reading waits this long (the last write).
SETTLE_S = 1.0
SEARCH_LIMIT = 200  # the most results a memory.search returns


@dataclass(frozen=True)
class Scene:
    """The screen in one colour for ``seconds`` of stream time."""

    colour: str
    seconds: float


def script(minutes: float, seed: int = 7) -> list[Scene]:
    """Scenes of 10 to 60 stream-seconds (the last one what is left) covering ``minutes``, each
    colour unlike the one before."""
    from server.models.colour_frames import COLOURS

    rng = np.random.default_rng(seed)
    scenes: list[Scene] = []
    left = minutes * 60
    while left > 0:
        colours = [c for c in COLOURS if not scenes or c != scenes[-1].colour]
        seconds = min(left, float(rng.uniform(*SCENE_S)))
        scenes.append(Scene(colours[int(rng.integers(len(colours)))], seconds))
        left -= seconds
    return scenes


def frame_colours(scenes: list[Scene]) -> list[str]:
    """The screen's colour at each frame of the stream (``FPS`` frames a stream-second)."""
    return [s.colour for s in scenes for _ in range(max(1, round(s.seconds * FPS)))]


def clip(colours: list[str], seed: int = 5) -> list[str]:
    """The camera's frames as base64 JPEG, ``colours[i]`` on the screen at frame ``i``."""
    from server.models.colour_frames import moving_clip

    return [base64.b64encode(f.jpeg).decode("ascii") for f in moving_clip(colours, CAMERA, seed)]


def scene_starts(scenes: list[Scene]) -> list[int]:
    """The frame each scene starts at, and the number of frames after them."""
    return [int(n) for n in np.cumsum([0] + [max(1, round(s.seconds * FPS)) for s in scenes])]


@dataclass
class Streamed:
    """One pass of the stream: each frame's server receive time, frames accepted, and the server
    CPU seconds spent meanwhile (event loop apart from the other threads)."""

    session_id: str
    image_side: int | None  # the model's (session.ready capabilities): keyframes are kept at most this large
    received_ms: list[float]
    accepted: int
    loop_s: float
    other_s: float

    def cpu_ms(self, loop_only: bool = False) -> float:
        """Server CPU ms per accepted frame (``loop_only``: the event loop's)."""
        spent = self.loop_s if loop_only else self.loop_s + self.other_s
        return spent * 1000 / max(self.accepted, 1)

    def frame_at(self, at_ms: float) -> int:
        """The frame the server received at ``at_ms`` (the last one by then)."""
        return max(0, bisect_right(self.received_ms, at_ms) - 1)


@dataclass
class Keyframes:
    """Why the moments were kept, against the script: the first frame, a scene change (with how
    many stream-seconds after the change), ``keyframe_s`` after the last one, or another change
    the similarity thumbnail saw inside a scene (by the scene's colour)."""

    first: int = 0
    change_delays_s: list[float] = field(default_factory=list)
    periodic: int = 0
    inside: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, frames: list[int], scenes: list[Scene]) -> Keyframes:
        """Classify the moments starting at ``frames`` (sorted frame numbers)."""
        starts = scene_starts(scenes)
        kinds = cls()
        for previous, frame in zip([None, *frames], frames, strict=False):
            scene = bisect_right(starts, frame) - 1
            if previous is None:
                kinds.first += 1
            elif bisect_right(starts, previous) - 1 != scene:
                kinds.change_delays_s.append((frame - starts[scene]) / FPS)
            elif frame - previous >= KEYFRAME_S * FPS - 1:  # a frame of slack for the receive clock
                kinds.periodic += 1
            else:
                kinds.inside[scenes[scene].colour] += 1
        return kinds


@dataclass
class MemoryFigures:
    """What one run measured (see the module docstring)."""

    scenes: list[Scene]
    speed: float
    backend: str
    offs: list[Streamed] = field(default_factory=list)  # the passes with memory off, in order
    ons: list[Streamed] = field(default_factory=list)  # with memory on; the last one's session is measured
    moments: list[dict] = field(default_factory=list)
    usage_bytes: int = 0
    file_bytes: int | None = None  # SQLite: the database and its WAL on disk
    range_right: int = 0
    range_asked: int = 0
    range_wrong: list[str] = field(default_factory=list)
    text_ms: list[float] = field(default_factory=list)
    text_hits: list[int] = field(default_factory=list)
    condition_s: float = 0.0
    searches: int = 0  # condition searches the stream took (a search returns at most SEARCH_LIMIT results)
    checked: int = 0
    skipped: int = 0
    found: set[int] = field(default_factory=set)
    truly_blue: set[int] = field(default_factory=set)
    deleted: int = 0
    usage_after_clear: int = 0
    writes: dict[str, int] = field(default_factory=dict)  # /metrics.json memory counts, the memory-on pass

    @property
    def stream_hours(self) -> float:
        return sum(s.seconds for s in self.scenes) / 3600

    @property
    def moment_bytes(self) -> int:
        return sum(m["bytes"] for m in self.moments)

    @property
    def bytes_per_hour(self) -> float:
        """Keyframe bytes per stream-hour (what the target is about)."""
        return self.moment_bytes / self.stream_hours

    @property
    def recall(self) -> float:
        return len(self.found & self.truly_blue) / len(self.truly_blue) if self.truly_blue else math.nan

    @property
    def precision(self) -> float:
        return len(self.found & self.truly_blue) / len(self.found) if self.found else math.nan

    @property
    def text_median_ms(self) -> float:
        return statistics.median(self.text_ms) if self.text_ms else math.nan

    @property
    def on(self) -> Streamed:
        """The last pass with memory on (its session is the one measured)."""
        return self.ons[-1]

    def memory_cpu_ms(self, loop_only: bool = False) -> float:
        """Server CPU ms per accepted frame with memory on, less with it off (means over the
        passes; ``loop_only``: the event loop's)."""
        on = statistics.mean(p.cpu_ms(loop_only) for p in self.ons)
        return on - statistics.mean(p.cpu_ms(loop_only) for p in self.offs)

    def lines(self) -> list[str]:
        """The figures, one printed line each."""
        on = self.on
        per_hour = 1 / self.stream_hours
        gaps = list(np.diff(on.received_ms))
        stream_s = self.stream_hours * 3600
        wall_s = (on.received_ms[-1] - on.received_ms[0]) / 1000
        kinds = Keyframes.of(sorted(on.frame_at(m["start_ms"]) for m in self.moments), self.scenes)
        delays = kinds.change_delays_s or [math.nan]
        inside = ", ".join(f"{colour} {n}" for colour, n in kinds.inside.most_common())
        sqlite = "" if self.file_bytes is None else f"; SQLite files on disk {self.file_bytes / 1e6:.2f} MB"
        w = self.writes
        loop = self.memory_cpu_ms(loop_only=True)
        met_bytes = _verdict(self.bytes_per_hour <= TARGET_BYTES_PER_HOUR)
        searches = f" in {self.searches} searches of at most {SEARCH_LIMIT} moments" if self.searches > 1 else ""
        return [
            f"pacing achieved (memory on): {stream_s / 60:.1f} stream-minutes received in {wall_s:.1f} s wall "
            f"(x{stream_s / max(wall_s, 1e-9):.1f}); gap between receipts p50 {percentile(gaps, 0.5):.1f} ms, "
            f"p99 {percentile(gaps, 0.99):.1f} ms (planned {1000 / FPS / self.speed:.1f} ms)",
            f"moments: {len(self.moments)} ({len(self.moments) * per_hour:.0f} per stream-hour): {kinds.first} first, "
            f"{len(kinds.change_delays_s)} at the {len(self.scenes) - 1} scene changes (p50 "
            f"{statistics.median(delays):.1f} s, max {max(delays):.1f} s after), {kinds.periodic} after "
            f"{KEYFRAME_S:g} s, {sum(kinds.inside.values())} at changes seen inside a scene ({inside or 'none'}); "
            f"keyframes at most {on.image_side} px a side, mean "
            f"{self.moment_bytes / max(len(self.moments), 1) / 1024:.1f} KiB",
            f"memory writes (memory-on pass): {w.get('written', 0)} written, {w.get('dropped', 0)} dropped, "
            f"{w.get('failed', 0)} failed; captions {w.get('captions', 0)} written, {w.get('captions_skipped', 0)} "
            "skipped (/metrics.json memory)",
            f"stored bytes per stream-hour ({self.backend}): {self.bytes_per_hour / 1e6:.2f} MB of keyframes (moments "
            f"listing), store usage() {self.usage_bytes * per_hour / 1e6:.2f} MB with the notes{sqlite} "
            f"(target <= {TARGET_BYTES_PER_HOUR / 1e6:.0f} MB: {met_bytes})",
            f"server CPU per accepted frame, passes off/on alternating: memory off {_cpu(self.offs)}; on "
            f"{_cpu(self.ons)}; memory's share (means) {self.memory_cpu_ms():+.3f} ms, event loop "
            f"{loop:+.3f} ms (target <= {TARGET_LOOP_MS} ms of event loop: {_verdict(loop <= TARGET_LOOP_MS)})",
            f"text search over the stream: median {self.text_median_ms:.1f} ms, max {max(self.text_ms):.1f} ms "
            f"over {len(self.text_ms)} searches (memory.search sent to memory.results read, at the client; "
            f"{statistics.median(self.text_hits):.0f} hits median) "
            f"(target <= {TARGET_TEXT_MS:.0f} ms: {_verdict(self.text_median_ms <= TARGET_TEXT_MS)})",
            f"condition search {CONDITION!r} over the stream: {self.condition_s:.1f} s wall{searches}, {self.checked} "
            f"moments checked ({self.skipped} skipped); recall {self.recall:.3f} ({len(self.found & self.truly_blue)} "
            f"of {len(self.truly_blue)} blue moments), precision {self.precision:.3f} ({len(self.found)} found)",
            f"range questions: {self.range_right} of {self.range_asked} answers name the scene's colour "
            f"({self.range_right / max(self.range_asked, 1):.3f})"
            + "".join(f"; {w}" for w in self.range_wrong[:5]),
            f"memory.clear: {self.deleted} records deleted, the session's usage() after {self.usage_after_clear} B",
        ]


def _verdict(good: bool) -> str:
    return "met" if good else "NOT met"


def _cpu(passes: list[Streamed]) -> str:
    return (" and ".join(f"{p.cpu_ms():.3f}" for p in passes) + " ms (event loop "
            + " and ".join(f"{p.cpu_ms(True):.3f}" for p in passes) + f"; {passes[0].accepted} frames each)")


# ---------------------------------------------------------------------- one server


def _cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of the server's event loop (its main thread) and of the whole process (every
    thread, those that ended too: the pool's threads come and go)."""
    return sum(thread_cpu_s(pid)[str(pid)]), process_cpu_s(pid)


async def _stream(server: ServerAddress, pid: int, frames: list[str], remember: bool,
                  speed: float) -> tuple[Connection, Streamed]:
    """One session streams ``frames`` paced at ``FPS * speed`` a wall-second, each once the one
    before is acked; returns it still open and what it measured."""
    config = {"memory": {"enabled": remember}, "prefix_warmup": False, "sampling": {"max_tokens": 3, "temperature": 0}}
    conn, ready = await Connection.open(server.ws_url, config, open_timeout=120)
    received: list[float] = []
    accepted = 0
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
            await wait_idle(http)
            before = _cpu_s(pid)
            start = time.perf_counter()
            for n, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, start + n / (FPS * speed) - time.perf_counter()))
                await conn.send_frame(frame, frame_id=n, pts_ms=n * 1000 / FPS)
                ack = (await conn.wait_acks(1))[0]
                received.append(ack.server_receive_ts_ms)
                accepted += ack.accepted
            await wait_idle(http)
            while (await http.get("/metrics.json")).json()["memory"]["pending"]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(SETTLE_S)
            after = _cpu_s(pid)
    except BaseException:
        await conn.close()
        raise
    loop, total = after[0] - before[0], after[1] - before[1]
    side = ready.event.capabilities.get("max_image_side")
    return conn, Streamed(ready.event.session_id, side, received, accepted, loop, total - loop)


async def _moments(http: httpx.AsyncClient, session_id: str) -> list[dict]:
    """Every moment of the session, once no more are being written (the listing stops growing)."""
    found: list[dict] = []
    deadline = time.monotonic() + 60
    while True:
        listed: list[dict] = []
        while True:  # the listing gives at most 1000 a call
            params = {"from_ms": listed[-1]["start_ms"] + 1e-3} if listed else {}
            page = (await http.get(f"/v1/sessions/{session_id}/moments", params=params)).json()["moments"]
            listed += page
            if len(page) < 1000:
                break
        if (listed and len(listed) == len(found)) or time.monotonic() > deadline:
            return listed
        found = listed
        await asyncio.sleep(0.5)


async def _ask_ranges(conn: Connection, on: Streamed, scenes: list[Scene], figures: MemoryFigures) -> list[str]:
    """``RANGE_QUESTIONS`` questions about past scenes (evenly spread over the script, the last
    scene left out: it is now), each over its scene less its first ``MARGIN_S``; returns the answers."""
    firsts = scene_starts(scenes)
    margin = round(MARGIN_S * FPS)
    past = [k for k in range(len(scenes) - 1) if firsts[k + 1] - 1 > firsts[k] + margin]
    picks = sorted({past[round(i * (len(past) - 1) / max(RANGE_QUESTIONS - 1, 1))]
                    for i in range(RANGE_QUESTIONS)}) if past else []
    answers = []
    for k in picks:
        span = {"from_ms": on.received_ms[firsts[k] + margin], "to_ms": on.received_ms[firsts[k + 1] - 1]}
        events = await conn.answer(QUESTION, timeout=300, range=span)
        text = "".join(e.event.delta for e in events if isinstance(e.event, ResponseTextDelta)).strip()
        done = events[-1].event
        assert isinstance(done, ResponseDone)
        figures.range_asked += 1
        if scenes[k].colour in text.lower():
            figures.range_right += 1
        else:
            figures.range_wrong.append(f"scene {k} {scenes[k].colour}: {text!r} ({done.status})")
        answers.append(text)
    return answers


async def _search(conn: Connection, search: MemorySearch, timeout: float = 60) -> tuple[float, MemoryResults]:
    """Send ``search``; returns the wall seconds to its ``memory.results`` and the results."""
    sent = time.perf_counter()
    await conn.send_raw(search.model_dump_json(exclude_none=True))
    received = await conn.wait_for("memory.results", timeout)
    assert isinstance(received.event, MemoryResults)
    return received.at - sent, received.event


async def _search_condition(conn: Connection, figures: MemoryFigures) -> None:
    """``CONDITION`` over every moment: one search, or, past ``SEARCH_LIMIT`` moments (a search
    returns at most that many), one per run of that many moments, one after the other."""
    starts = [m["start_ms"] for m in figures.moments]
    for first in range(0, len(starts), SEARCH_LIMIT):
        after = first + SEARCH_LIMIT
        # a range holds the moment current at from_ms and those starting by to_ms: these runs do not overlap
        to_ms = starts[after] - 1e-3 if after < len(starts) else None
        search = MemorySearch(type="memory.search", search_id=f"blue-{first}", condition=CONDITION,
                              from_ms=starts[first], to_ms=to_ms, limit=SEARCH_LIMIT)
        took, results = await _search(conn, search, timeout=1800)
        figures.condition_s += took
        figures.searches += 1
        figures.checked += results.checked
        figures.skipped += results.skipped
        figures.found |= {r.moment_id for r in results.results}


async def _measure(server: ServerAddress, pid: int, store_url: str | None, data_dir: Path,
                   scenes: list[Scene], frames: list[str], speed: float, backend: str) -> MemoryFigures:
    """The run on a served server (see the module docstring). Whatever happens, every session
    that remembered is cleared from the store after (the bench leaves nothing in a shared one)."""
    from server.memory.factory import DEFAULT_SQLITE_FILE, open_store
    from server.memory.store import MemoryLimits

    figures = MemoryFigures(scenes, speed, backend)
    store = open_store(store_url, data_dir, MemoryLimits(1e9, 2**62, 2**62))  # the server's store, read beside it
    await store.open()
    remembered: list[str] = []
    try:
        warm, streamed = await _stream(server, pid, frames[:WARMUP_FRAMES], True, speed)  # first-call costs
        remembered.append(streamed.session_id)
        await _forget(warm)
        for n in range(PASSES):
            off, streamed = await _stream(server, pid, frames, False, speed)
            figures.offs.append(streamed)
            await off.close()
            async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
                before = (await http.get("/metrics.json")).json()["memory"]
                conn, on = await _stream(server, pid, frames, True, speed)
                after = (await http.get("/metrics.json")).json()["memory"]
            remembered.append(on.session_id)
            figures.ons.append(on)
            if n < PASSES - 1:
                await _forget(conn)
        figures.writes = {k: after[k] - before[k] for k in ("written", "dropped", "failed", "captions",
                                                            "captions_skipped")}
        try:
            async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
                figures.moments = await _moments(http, on.session_id)
            answers = await _ask_ranges(conn, on, scenes, figures)
            words = sorted({w for a in answers for w in a.lower().split() if w.isalpha()}) + ["screen"]
            for n in range(TEXT_SEARCHES):
                text = MemorySearch(type="memory.search", text=words[n % len(words)], limit=SEARCH_LIMIT)
                took, found = await _search(conn, text)
                figures.text_ms.append(took * 1000)
                figures.text_hits.append(len(found.results))
            await _search_condition(conn, figures)
            colours = frame_colours(scenes)
            figures.truly_blue = {m["moment_id"] for m in figures.moments
                                  if colours[on.frame_at(m["start_ms"])] == BLUE}
            figures.usage_bytes = await store.usage(on.session_id)
            if store.backend == "sqlite":
                database = data_dir / DEFAULT_SQLITE_FILE
                figures.file_bytes = sum(p.stat().st_size for p in database.parent.glob(database.name + "*"))
            figures.deleted = await _forget(conn)
            figures.usage_after_clear = await store.usage(on.session_id)
        finally:
            await conn.close()
    finally:
        for session_id in remembered:  # nothing left if memory.clear ran: this is for a run that failed
            await store.clear(session_id)
        await store.close()
    return figures


async def _forget(conn: Connection) -> int:
    """``memory.clear`` on ``conn``, then closed; returns the records deleted."""
    try:
        await conn.send_raw(MemoryClear(type="memory.clear").model_dump_json())
        cleared = (await conn.wait_for("memory.cleared")).event
        assert isinstance(cleared, MemoryCleared)
        return cleared.deleted
    finally:
        await conn.close()


def run_memory(scenes: list[Scene], memory_url: str | None = None, speed: float = DEFAULT_SPEED) -> MemoryFigures:
    """Serve the shipped colours model with its memory in a temporary data directory's SQLite (or
    at ``memory_url``), the keyframe settings divided by ``speed``, and measure ``scenes``
    streamed ``speed`` times faster than real time; the data directory is removed after.

    Returns the figures. Raises ``RuntimeError`` when the server does not start, ``StreamError``,
    ``TimeoutError`` or ``websockets.ConnectionClosed`` when a session fails.
    """
    from server.models.demo import DEMO_FAMILY, shipped_model_dir

    frames = clip(frame_colours(scenes))
    data_dir = Path(tempfile.mkdtemp(prefix="livesight-bench-memory-"))
    try:
        args = ["--log-level", "warning", "--model", str(shipped_model_dir(DEMO_FAMILY)), "--data-dir", str(data_dir),
                "--memory-keyframe-s", repr(KEYFRAME_S / speed),
                "--memory-min-keyframe-s", repr(MIN_KEYFRAME_S / speed),
                "--intake-max-wait-ms", "600000", "--resume-grace-s", "0"]
        if memory_url:
            args += ["--memory-url", memory_url]
        backend = "PostgreSQL" if memory_url and memory_url.startswith("postgres") else "SQLite"
        with serve_process(args) as served:
            return asyncio.run(_measure(served, served.proc.pid, memory_url, data_dir, scenes, frames, speed, backend))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def bench_memory(minutes: float, memory_url: str | None, speed: float) -> None:
    """``livesight bench memory``: prints what it does, then one line per figure."""
    scenes = script(minutes)
    where = ("PostgreSQL at --memory-url" if memory_url and memory_url.startswith("postgres")
             else "--memory-url" if memory_url else "SQLite in a temporary data dir (removed after)")
    print(f"bench memory: {minutes:g} stream-minutes of a {FPS:g} fps camera ({len(frame_colours(scenes))} frames "
          f"{CAMERA[0]}x{CAMERA[1]}, {len(scenes)} scenes of {SCENE_S[0]:g}-{SCENE_S[1]:g} s, script seed 7) on the "
          f"shipped colours model, memory in {where}; frames paced at {FPS * speed:g} a wall-second, each after "
          f"the previous ack (x{speed:g}), so memory_keyframe_s={KEYFRAME_S / speed:g} and memory_min_keyframe_s="
          f"{MIN_KEYFRAME_S / speed:g} ({KEYFRAME_S:g} s and {MIN_KEYFRAME_S:g} s of stream time); prefix_warmup "
          f"off (so no captions); the stream {2 * PASSES} times, memory off and on in turn", flush=True)
    for line in run_memory(scenes, memory_url, speed).lines():
        print(line)
