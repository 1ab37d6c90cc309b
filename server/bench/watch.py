"""``livesight bench watch``: what watches cost, and how well they fire, on the colours model.

The server runs in its own process (``livesight serve``) on a model that knows colours:
``--model``, else the demo model (the colours model, ``server.models.colours``, trained into
the cache the first time: minutes, timed apart, not part of the run). Every session streams one scripted
clip at 2 fps: a camera looking at a screen (``server.models.colour_frames``: texture, noise
and small moving objects, so the similarity filter keeps the frames) whose colour changes
every ``SCENE_FRAMES`` frames, grey between colours: grey, red, grey, blue, grey, green, grey,
yellow, ... With watches, a session holds K alert watches, "Is the screen red?", "... blue?"
(the first K of ``WATCHED``; colours past K stay in the clip as distractors), each with
``cooldown_s`` 0 (every scene may fire) and ``report_checks``.

A run:

1. cost, on an idle server: one session with the K watches is sent grey frames one by one;
   at 8 and at 32 buffered frames the checks of the newest frames (``watch.check`` ``ms``: one
   engine call for the K watches) are set against a warm question's time to first output on
   the same frames (the server's ``ttft_ms``, and its first text at the client), and against
   the same question's cold prefill (new sessions without a warm prefix on the same frames).
2. load: N sessions stream ``seconds`` of the clip without watches (the baseline), then the
   same with watches, alternating for ``rounds`` rounds; each session asks "What colour is
   the screen?" once a phase (at frame ``ASK_AT`` + its index).

Printed: check vs question (1); frame ack p50/p99 and question TTFT with and without watches,
and their ratios; watch.check ms under load; decision latency (the event frame's receipt at
the server -> ``watch.fired`` at the client, and the server's ``decision_ms``) p50/p95; hits,
misses and false fires against the script; checks skipped (accepted frames no check looked
at, as the client sees them from ``watch.check``, and the server's counts from
``/metrics.json``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import websockets

from handlers.wire.protocol import (
    ErrorEvent,
    FrameAck,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    WatchCheck,
    WatchFired,
)
from server.background import serve_process
from server.bench.latency import percentile
from server.bench.served import serve_args, wait_idle, wait_sessions_closed
from server.client.connection import Connection

FPS = 2.0
SCENE_FRAMES = 6  # 3 s a scene at 2 fps: room for a fire, then two clear checks on grey
WATCHED = ("red", "blue", "green", "yellow", "white", "black")
BETWEEN = "grey"
CAMERA = (320, 240)
ASK_AT = 10  # the frame after which a session asks its question (plus its index, up to a scene)
QUESTION = "What colour is the screen?"
COST_FRAMES = (8, 32)
COST_CHECKS = 5  # checks, and questions, timed at each of COST_FRAMES
FIRED_TOKENS = 8
#: After its last frame a session waits this long at most for its acks and its answer.
SETTLE_S = 30.0


# ---------------------------------------------------------------------- the script


def script(frames: int) -> list[str]:
    """The screen's colour at each frame: grey, then each of ``WATCHED`` in turn, grey between."""
    scenes = [BETWEEN if k % 2 == 0 else WATCHED[(k // 2) % len(WATCHED)] for k in range(-(-frames // SCENE_FRAMES))]
    return [scenes[i // SCENE_FRAMES] for i in range(frames)]


def scene_starts(colours: list[str]) -> list[tuple[int, int]]:
    """Each scene of a watched colour as (first frame, frame after its last)."""
    out, start = [], 0
    for i in range(1, len(colours) + 1):
        if i == len(colours) or colours[i] != colours[start]:
            if colours[start] != BETWEEN:
                out.append((start, i))
            start = i
    return out


def clip_frames(colours: list[str], seed: int = 3) -> list[str]:
    """The clip as base64 JPEG: one scene (its objects move on) whose screen takes ``colours``."""
    from server.models.colour_frames import moving_clip

    return [base64.b64encode(f.jpeg).decode("ascii") for f in moving_clip(colours, CAMERA, seed)]


def watch_specs(count: int) -> list[dict]:
    """The sessions' watches: one per colour of the first ``count`` of ``WATCHED``."""
    return [
        {"watch_id": colour, "condition": f"Is the screen {colour}?", "cooldown_s": 0, "report_checks": True,
         "response": {"max_tokens": FIRED_TOKENS}}
        for colour in WATCHED[:count]
    ]


def session_config(watches: int) -> dict:
    return {"sampling": {"max_tokens": 4, "temperature": 0}, "watches": watch_specs(watches)}


# ---------------------------------------------------------------------- one session


@dataclass(frozen=True)
class Fire:
    session: int
    watch_id: str
    frame_id: int
    at_ms: float  # wall clock at the client
    decision_ms: float | None


@dataclass
class Tally:
    """What one phase's sessions saw."""

    watches: int
    ack_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    server_ttft_ms: list[float] = field(default_factory=list)
    cached_share: list[float] = field(default_factory=list)  # each question's cached / prompt tokens
    check_ms: list[float] = field(default_factory=list)
    fires: list[Fire] = field(default_factory=list)
    receipts: dict[tuple[int, int], float] = field(default_factory=dict)  # (session, frame) -> server receipt, ms
    accepted: set[tuple[int, ...]] = field(default_factory=set)  # (session, frame); merged: (phase, session, frame)
    checked: set[tuple[int, ...]] = field(default_factory=set)
    sent: int = 0
    filtered: int = 0
    shed: int = 0
    lost: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    fired_answers: int = 0


class StreamedSession:
    """One session of a phase: streams the clip at ``FPS``, asks once, and records what comes back."""

    def __init__(self, conn: Connection, frames: list[str], index: int, tally: Tally) -> None:
        self.conn, self.frames, self.index, self.tally = conn, frames, index, tally
        self.pending: dict[int, float] = {}  # frame id -> when sent (perf_counter)
        self.asked_at: float | None = None
        self.question: str | None = None  # its answer's request id
        self.timed = False  # its first output has been timed
        self.answered = False
        self.streamed = False

    @property
    def settled(self) -> bool:
        return self.streamed and not self.pending and (self.asked_at is None or self.answered)

    async def run(self) -> None:
        """Stream the clip, then wait (``SETTLE_S`` at most) for the acks and the answer due."""
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(self._read())
            await self._stream()
            if not self.settled:
                await asyncio.wait({reader}, timeout=SETTLE_S)
            reader.cancel()
        self.tally.lost += len(self.pending)

    async def _stream(self) -> None:
        start = time.perf_counter() + random.random() / FPS  # sessions out of step, as cameras are
        for n, frame in enumerate(self.frames):
            await asyncio.sleep(max(0.0, start + n / FPS - time.perf_counter()))
            self.pending[n] = time.perf_counter()
            self.tally.sent += 1
            await self.conn.send_frame(frame, frame_id=n, pts_ms=n * 1000 / FPS)
            if n == ASK_AT + self.index % SCENE_FRAMES:
                self.asked_at = time.perf_counter()
                await self.conn.query(QUESTION)
        self.streamed = True

    async def _read(self) -> None:
        try:
            while not self.settled:
                self._on((await self.conn.receive()).event)
        except websockets.ConnectionClosed:
            self.tally.errors["closed by the server"] = self.tally.errors.get("closed by the server", 0) + 1

    def _on(self, event: object) -> None:
        tally, now = self.tally, time.perf_counter()
        if isinstance(event, FrameAck):
            frame = int(event.frame_id)
            sent = self.pending.pop(frame, None)
            if sent is not None:
                tally.ack_ms.append((now - sent) * 1000)
            tally.receipts[(self.index, frame)] = event.server_receive_ts_ms
            if event.accepted:
                tally.accepted.add((self.index, frame))
            elif event.reason == "overloaded":
                tally.shed += 1
            else:
                tally.filtered += 1
        elif isinstance(event, WatchCheck):
            tally.check_ms.append(event.ms)
            tally.checked.add((self.index, int(event.frame_id)))
        elif isinstance(event, WatchFired):
            tally.fires.append(Fire(self.index, event.watch_id, int(event.frame_id), time.time() * 1000,
                                    event.decision_ms))
        elif isinstance(event, ResponseStart):
            if event.trigger is not None:
                tally.fired_answers += 1
            elif self.asked_at is not None and self.question is None:
                self.question = event.request_id  # questions are answered in order: this is ours
        elif isinstance(event, ResponseTextDelta):
            if event.request_id == self.question and not self.timed and self.asked_at is not None:
                self.timed = True
                tally.ttft_ms.append((now - self.asked_at) * 1000)
        elif isinstance(event, ResponseDone):
            if event.request_id == self.question:
                self.answered = True
                if event.timings.ttft_ms is not None:
                    tally.server_ttft_ms.append(event.timings.ttft_ms)
                if event.usage.prompt_tokens:
                    tally.cached_share.append(event.usage.cached_tokens / event.usage.prompt_tokens)
        elif isinstance(event, ErrorEvent):
            tally.errors[event.code] = tally.errors.get(event.code, 0) + 1
            if event.code == "no_frames" and self.question is None:
                self.answered = True


async def run_phase(url: str, frames: list[str], sessions: int, watches: int) -> Tally:
    """``sessions`` sessions with ``watches`` watches each stream ``frames``; returns what they saw."""
    tally = Tally(watches)

    async def one(index: int) -> None:
        conn, _ = await Connection.open(url, session_config(watches), open_timeout=60, compression=None)
        try:
            await StreamedSession(conn, frames, index, tally).run()
        finally:
            await conn.close()

    await asyncio.gather(*(one(i) for i in range(sessions)))
    return tally


# ---------------------------------------------------------------------- cost on an idle server


@dataclass(frozen=True)
class Cost:
    """At ``frames`` buffered frames: ``COST_CHECKS`` checks (each of the newest frame) and as
    many warm questions."""

    frames: int
    check_ms: list[float]
    ttft_ms: list[float]  # question sent -> its first text, at the client
    server_ttft_ms: list[float]
    prompt_tokens: int
    cold_ms: list[float]  # the same question in a session without a warm prefix (the server's ttft_ms)
    cold_cached: int  # prompt tokens the cold question found cached (0: a whole prefill)
    cold_tokens: int  # the cold question's prompt tokens (the warm one's: the same frames)


async def _check_of(conn: Connection, frame: str, frame_id: int, watches: int) -> float:
    """Send one frame and wait for its round of checks; returns its ms (one engine call for all
    the watches), NaN when the frame was filtered out."""
    await conn.send_frame(frame, frame_id=frame_id, pts_ms=frame_id * 1000 / FPS)
    ack = (await conn.wait_acks(1))[0]
    if not ack.accepted:
        return float("nan")
    seen: dict[str, float] = {}
    while len(seen) < watches:
        event = (await conn.receive(120)).event
        if isinstance(event, WatchCheck) and int(event.frame_id) == frame_id:
            seen[event.watch_id] = event.ms
    return max(seen.values())


async def _first_text(conn: Connection, text: str) -> tuple[float, ResponseDone]:
    """Ask ``text``; returns the ms to its first text delta at the client, and its response.done."""
    sent = time.perf_counter()
    first = float("nan")
    for received in await conn.answer(text):
        if isinstance(received.event, ResponseTextDelta) and first != first:
            first = (received.at - sent) * 1000
    assert isinstance(received.event, ResponseDone)
    return first, received.event


async def cold_prefill(url: str, http_url: str, frames: list[str], config: dict) -> tuple[list[float], int, int]:
    """``COST_CHECKS`` questions, each in a new session without a warm prefix on ``frames``
    (no watches), on an idle server: the server's ttft_ms of each, the fewest prompt tokens one
    found cached, and the most prompt tokens one had.

    The prompt holds every one of ``frames``, as the warm session's does (without a warm
    prefix ``num_frames`` is 4 unless set). The frames are the warm session's, so the engine
    has already preprocessed their pixels: the figure is a prefill's model steps alone, less
    than a new camera's frames would cost."""
    out, cached, tokens = [], None, 0
    async with httpx.AsyncClient(base_url=http_url) as http:
        for _ in range(COST_CHECKS):
            conn, _ = await Connection.open(url, {**config, "prefix_warmup": False, "num_frames": len(frames)},
                                            open_timeout=60)
            try:
                for n, frame in enumerate(frames):
                    await conn.send_frame(frame, frame_id=n, pts_ms=n * 1000 / FPS)
                await conn.wait_acks(len(frames))
                await wait_idle(http)
                _, done = await _first_text(conn, QUESTION)
                out.append(done.timings.ttft_ms or float("nan"))
                cached = min(done.usage.cached_tokens, cached if cached is not None else done.usage.cached_tokens)
                tokens = max(tokens, done.usage.prompt_tokens)
            finally:
                await conn.close()
    return out, cached or 0, tokens


async def measure_cost(url: str, http_url: str, watches: int) -> tuple[list[Cost], int | None]:
    """One session with ``watches`` watches on grey frames (no watch fires), on an idle server:
    at each of ``COST_FRAMES`` buffered frames, the checks of the last ``COST_CHECKS`` frames
    (sent one by one) against as many warm questions, and the same question's cold prefill (a
    new session without a warm prefix on the same frames, ``cold_prefill``); returns them and
    the tokens a check adds."""
    grey = clip_frames([BETWEEN] * max(COST_FRAMES), seed=5)
    config = {"sampling": {"max_tokens": 4, "temperature": 0}, "max_frames": max(COST_FRAMES) + 8}
    conn, ready = await Connection.open(url, config, open_timeout=60)
    if not ready.event.capabilities.get("token_probabilities"):
        await conn.close()
        raise RuntimeError(f"engine {ready.event.capabilities.get('name')!r} gives no token probabilities: "
                           "it never checks a watch")
    out, sent, tokens = [], 0, None
    async with httpx.AsyncClient(base_url=http_url) as http:
        try:
            for spec in watch_specs(watches):
                await conn.send_raw(json.dumps({"type": "watch.create", **spec}))
                tokens = (await conn.wait_for("watch.created")).event.tokens_per_check
            for count in COST_FRAMES:
                batch = max(sent, count - COST_CHECKS)
                for n in range(sent, batch):
                    await conn.send_frame(grey[n], frame_id=n, pts_ms=n * 1000 / FPS)
                await conn.wait_acks(batch - sent)
                checks = [await _check_of(conn, grey[n], n, watches) for n in range(batch, count)]
                sent = count
                firsts, server, tokens_in = [], [], 0
                for _ in range(COST_CHECKS):
                    await wait_idle(http)
                    first, done = await _first_text(conn, QUESTION)
                    firsts.append(first)
                    server.append(done.timings.ttft_ms or float("nan"))
                    tokens_in = done.usage.prompt_tokens
                cold, cold_cached, cold_tokens = await cold_prefill(url, http_url, grey[:count], config)
                out.append(Cost(count, [c for c in checks if c == c] or [float("nan")], firsts, server, tokens_in,
                                cold, cold_cached, cold_tokens))
        finally:
            await conn.close()
    return out, tokens


# ---------------------------------------------------------------------- against the script


@dataclass
class Score:
    """The watched phases' fires against the script."""

    events: int = 0
    hits: int = 0
    false_fires: int = 0
    repeats: int = 0  # a second fire in the same scene (its condition flickered off and on)
    decision_ms: list[float] = field(default_factory=list)  # the event frame's receipt -> watch.fired
    server_decision_ms: list[float] = field(default_factory=list)
    by_colour: dict[str, list[int]] = field(default_factory=dict)  # colour -> [hits, events]


def score(tallies: list[Tally], colours: list[str], sessions: int) -> Score:
    """Hits (a watch fired on a frame of a scene of its colour: the first such fire), misses
    and false fires (on a frame of another colour) of the phases with watches."""
    out = Score()
    for tally in tallies:
        watched = set(WATCHED[: tally.watches])
        fires = sorted(tally.fires, key=lambda f: (f.session, f.watch_id, f.frame_id))
        for fire in fires:
            if fire.frame_id >= len(colours) or colours[fire.frame_id] != fire.watch_id:
                out.false_fires += 1
        for session in range(sessions):
            for start, end in scene_starts(colours):
                colour = colours[start]
                if colour not in watched:
                    continue
                out.events += 1
                tally_c = out.by_colour.setdefault(colour, [0, 0])
                tally_c[1] += 1
                mine = [f for f in fires if f.session == session and f.watch_id == colour and start <= f.frame_id < end]
                if not mine:
                    continue
                out.hits += 1
                tally_c[0] += 1
                out.repeats += len(mine) - 1
                receipt = tally.receipts.get((session, start))
                if receipt is not None:
                    out.decision_ms.append(mine[0].at_ms - receipt)
                if mine[0].decision_ms is not None:
                    out.server_decision_ms.append(mine[0].decision_ms)
    return out


# ---------------------------------------------------------------------- the report


def _ms(values: list[float], *qs: float) -> str:
    return "/".join(f"{percentile(values, q):.1f}" for q in qs) + " ms"


def _share(values: list[float]) -> str:
    return f"{100 * percentile(values, 0.5):.0f}%/{100 * min(values):.0f}%" if values else "n/a"


def _latency(values: list[float]) -> str:
    return _ms(values, 0.5, 0.95) if values else "n/a (no hits)"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def _merged(tallies: list[Tally]) -> Tally:
    out = Tally(tallies[0].watches if tallies else 0)
    for phase, t in enumerate(tallies):
        out.ack_ms += t.ack_ms
        out.ttft_ms += t.ttft_ms
        out.server_ttft_ms += t.server_ttft_ms
        out.cached_share += t.cached_share
        out.check_ms += t.check_ms
        out.sent += t.sent
        out.filtered += t.filtered
        out.shed += t.shed
        out.lost += t.lost
        out.fired_answers += t.fired_answers
        out.accepted |= {(phase, *k) for k in t.accepted}
        out.checked |= {(phase, *k) for k in t.checked}
        for code, n in t.errors.items():
            out.errors[code] = out.errors.get(code, 0) + n
    return out


def skipped_metric(metrics: dict) -> str:
    """The server's own counts of watch checks run and skipped, from ``/metrics.json``."""
    watches = metrics.get("watches", {})
    return f"{watches.get('skipped', 'n/a')} skipped, {watches.get('checks', 'n/a')} run, {watches.get('fires', 'n/a')} fires"


def render(costs: list[Cost], tokens_per_check: int | None, base: list[Tally], watched: list[Tally],
           colours: list[str], sessions: int, watches: int, metrics: dict) -> list[str]:
    """The report's lines after its heading."""
    lines = [f"cost on an idle server (1 session, {watches} watches, tokens per check ~{tokens_per_check}; "
             f"{COST_CHECKS} checks and {COST_CHECKS} questions at each count):"]
    for c in costs:
        check, ttft = statistics.median(c.check_ms), statistics.median(c.server_ttft_ms)
        cold = statistics.median(c.cold_ms)
        lines.append(
            f"  {c.frames:3d} frames ({c.prompt_tokens} prompt tokens): check median {check:.1f} ms (min "
            f"{min(c.check_ms):.1f}; one engine call for {watches} watches) vs warm question TTFT median {ttft:.1f} ms "
            f"at the server (min {min(c.server_ttft_ms):.1f}), {statistics.median(c.ttft_ms):.1f} ms at the client: "
            f"check / question {_ratio(check, ttft)} (mins {_ratio(min(c.check_ms), min(c.server_ttft_ms))}); "
            f"cold prefill (no warm prefix, {c.cold_tokens} prompt tokens, {c.cold_cached} cached) median {cold:.1f} ms "
            f"(min {min(c.cold_ms):.1f}): check / cold {_ratio(check, cold)}"
        )
    b, w = _merged(base), _merged(watched)
    s = score(watched, colours, sessions)
    unchecked = len(w.accepted - w.checked)
    lines += [
        f"load: {sessions} sessions x {len(colours) / FPS:g} s at {FPS:g} fps, {len(base)} rounds of without / with "
        f"{watches} watches, alternating; one question per session per phase",
        f"  frames sent {b.sent} / {w.sent}, accepted {len(b.accepted)} / {len(w.accepted)}, filtered {b.filtered} / "
        f"{w.filtered}, shed {b.shed} / {w.shed}, lost acks {b.lost} / {w.lost} (without / with)",
        f"  frame ack p50/p99: without {_ms(b.ack_ms, 0.5, 0.99)}, with {_ms(w.ack_ms, 0.5, 0.99)}; "
        f"p99 with / without {_ratio(percentile(w.ack_ms, 0.99), percentile(b.ack_ms, 0.99))}",
        f"  question TTFT p50/p95 at the client: without {_ms(b.ttft_ms, 0.5, 0.95)}, with {_ms(w.ttft_ms, 0.5, 0.95)} "
        f"({len(b.ttft_ms)} / {len(w.ttft_ms)} questions); p50 with / without "
        f"{_ratio(percentile(w.ttft_ms, 0.5), percentile(b.ttft_ms, 0.5))}; at the server p50 "
        f"{percentile(b.server_ttft_ms, 0.5):.1f} / {percentile(w.server_ttft_ms, 0.5):.1f} ms; prompt cached "
        f"p50/min {_share(b.cached_share)} / {_share(w.cached_share)}",
        f"  checks under load: {len(w.check_ms) // max(watches, 1)} rounds, watch.check p50/p95 "
        f"{_ms(w.check_ms, 0.5, 0.95)}; accepted frames no check looked at (client): {unchecked} of "
        f"{len(w.accepted)} ({100 * unchecked / max(len(w.accepted), 1):.0f}%); server's count: {skipped_metric(metrics)}",
        f"  decision latency (event frame received -> watch.fired at the client) p50/p95 {_latency(s.decision_ms)}; "
        f"server decision_ms p50/p95 {_latency(s.server_decision_ms)}",
        f"  hits {s.hits} of {s.events} events, misses {s.events - s.hits}, false fires {s.false_fires} "
        f"(repeat fires within a scene {s.repeats}); by colour "
        + ", ".join(f"{c} {h}/{n}" for c, (h, n) in s.by_colour.items())
        + f"; fired answers {w.fired_answers}",
        f"  errors: without {b.errors or 'none'}, with {w.errors or 'none'}",
    ]
    return lines


# ---------------------------------------------------------------------- the run


@contextmanager
def colours_model(model: str | None) -> Iterator[tuple[str, float | None]]:
    """``model``, or the demo model (the colours model, trained into the cache the first time);
    yields the path and the seconds training took (None when nothing was trained)."""
    if model:
        yield model, None
        return
    from server.models.demo import demo_model_dir, resolve_model
    from server.settings import Settings

    settings = Settings()
    trained = not demo_model_dir(settings).is_dir()
    started = time.perf_counter()
    path = resolve_model(settings)
    yield path, (time.perf_counter() - started) if trained else None


def run_watch(model: str | None, sessions: int, watches: int, seconds: float, rounds: int = 2) -> str:
    """Serve the colours model (``model``, else one trained first), measure a check's cost, then
    stream ``rounds`` alternating phases without and with ``watches`` watches from
    ``sessions`` sessions for ``seconds`` each; returns the report."""
    from server.models.colours import read_colours_card

    watches = max(1, min(watches, len(WATCHED)))
    colours = script(max(SCENE_FRAMES * 2, round(seconds * FPS)))
    frames = clip_frames(colours)
    with colours_model(model) as (path, trained_s):
        card = read_colours_card(Path(path)) if Path(path).is_dir() else None
        about = (f"colours model ({card.family}, held-out accuracy {card.accuracy})" if card
                 else f"{path}: not a colours model, so hits and misses say nothing of it")
        trained = "" if trained_s is None else f", trained here in {trained_s:.0f} s (not part of the run)"
        heading = [
            f"bench watch: {about}{trained}",
            f"clip: {CAMERA[0]}x{CAMERA[1]} JPEG at {FPS:g} fps, scenes of {SCENE_FRAMES} frames: "
            + " ".join(colours[i] for i in range(0, len(colours), SCENE_FRAMES))
            + f"; watches {', '.join(WATCHED[:watches])} (alert, cooldown 0, report_checks, answers of "
            f"{FIRED_TOKENS} tokens)",
        ]
        with serve_process(serve_args(path, "--max-sessions", str(sessions + 8))) as served:
            started = time.perf_counter()
            asyncio.run(run_phase(served.ws_url, frames[: SCENE_FRAMES * 2], 1, watches))  # first-use costs
            costs, tokens = asyncio.run(measure_cost(served.ws_url, served.http_url, watches))
            base, watched = [], []
            for _ in range(rounds):
                for count, into in ((0, base), (watches, watched)):
                    wait_sessions_closed(served.http_url)
                    into.append(asyncio.run(run_phase(served.ws_url, frames, sessions, count)))
            metrics = httpx.get(served.http_url + "/metrics.json", timeout=10).json()
            took = time.perf_counter() - started
    lines = heading + render(costs, tokens, base, watched, colours, sessions, watches, metrics)
    lines.append(f"measured in {took:.0f} s")
    return "\n".join(lines)
