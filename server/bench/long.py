"""``livesight bench long``: one camera session for a long time, many window slides, on one engine.

One v1 session streams a scripted camera (``server.models.colour_frames``: a screen that is grey,
then red, then grey, ..., a scene every ``SCENE_S`` seconds, with texture and moving objects so the
similarity filter keeps every frame) at ``fps`` for ``minutes``, with the server's default buffer
unless ``max_frames`` says otherwise, one alert watch ("Is the screen red?", cooldown 0) and a
question ("What colour is the screen?") every ``ask_every_s``. The buffer fills within the first
minute; after that the window slides at every frame (an engine that moves its warm prefix) or
every half window (one that warms the next window first), so nearly every question and check
lands on a slid window.

For each question: time to its first text at the client, the prompt's tokens and the share the
engine's cache served; at the end: time to first output p50/p90/p99/max, the questions under
90% cached, the prompt tokens the engine computed per accepted frame for the warm prefix (from
``/metrics.json``: ``engine.prompt_tokens_computed``) against a frame's own image tokens,
accepted frames no check looked at, fires against the red scenes (within two accepted frames of
a scene's first frame, late, missed) and false fires, and the server's RSS and KV cache tokens
at the first question, at minute 5 and at the last.

``run_session`` is the session alone, against any server; the suite runs it compressed (a
small buffer, frames sent as fast as each is checked) on each engine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from handlers.wire.protocol import (
    ErrorEvent,
    FrameAck,
    FramesConsumed,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    WatchCheck,
    WatchFired,
)
from server.background import ServerAddress
from server.bench.latency import percentile
from server.client.connection import Connection

QUESTION = "What colour is the screen?"
WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 0, "report_checks": True,
         "response": {"max_tokens": 4}}
WATCHED, BETWEEN = "red", "grey"
SCENE_S = 10.0
CAMERA = (320, 240)
WITHIN = 2  # a fire is on time within this many accepted frames of its scene's first frame
CACHED_ENOUGH = 0.9
ENGINES = ("transformers", "vllm", "openai")


def script(frames: int, scene_frames: int) -> list[str]:
    """The screen's colour at each frame: grey and red scenes of ``scene_frames`` in turn."""
    return [WATCHED if (i // scene_frames) % 2 else BETWEEN for i in range(frames)]


def clip(colours: list[str], seed: int = 5) -> list[str]:
    """The camera's frames as base64 JPEG (``colours[i]`` at frame i)."""
    from server.models.colour_frames import moving_clip

    return [base64.b64encode(f.jpeg).decode("ascii") for f in moving_clip(colours, CAMERA, seed)]


def red_scenes(colours: list[str]) -> list[int]:
    """The first frame of every red scene."""
    return [i for i, c in enumerate(colours) if c == WATCHED and (i == 0 or colours[i - 1] != WATCHED)]


@dataclass(frozen=True)
class Asked:
    """One question: when (s since the first frame), its time to first text, its usage."""

    at_s: float
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int
    frames: int  # frames its prompt held
    rss_mib: float | None
    kv_tokens: int | None

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class Session:
    """What one long session saw."""

    colours: list[str]
    asked: list[Asked] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    checked: set[int] = field(default_factory=set)
    fired: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    engine_before: dict = field(default_factory=dict)
    engine_after: dict = field(default_factory=dict)
    memory_before: dict = field(default_factory=dict)  # /metrics.json memory (empty: memory off)
    memory_after: dict = field(default_factory=dict)
    seconds: float = 0.0

    # -------------------------------------------------------------- figures
    def ttft(self, q: float) -> float:
        """The ``q`` percentile (0-100) of the questions' time to first text, ms."""
        return percentile([a.ttft_ms for a in self.asked], q / 100)

    @property
    def under_cached(self) -> list[Asked]:
        """The questions whose prompt the cache served less than 90% of."""
        return [a for a in self.asked if a.cached_share < CACHED_ENOUGH]

    def computed(self, work: str) -> int:
        """Prompt tokens the engine computed for ``work`` during the session."""
        before = (self.engine_before.get("prompt_tokens_computed") or {}).get(work, 0)
        return (self.engine_after.get("prompt_tokens_computed") or {}).get(work, 0) - before

    @property
    def frame_tokens(self) -> float:
        """A frame's own image tokens (from the questions' usage)."""
        counts = [a.image_tokens / a.frames for a in self.asked if a.frames]
        return statistics.median(counts) if counts else 0.0

    @property
    def warm_per_frame(self) -> float:
        """Warm-prefix tokens computed per accepted frame."""
        return self.computed("warm") / len(self.accepted) if self.accepted else 0.0

    @property
    def skipped(self) -> int:
        """Accepted frames no check looked at."""
        return len(set(self.accepted) - self.checked)

    def fires(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Red scenes fired on time, late and missed (each by its first frame), and false fires."""
        on_time, late, missed = [], [], []
        starts = red_scenes(self.colours)
        order = {frame: n for n, frame in enumerate(self.accepted)}
        for start in starts:
            end = next((s for s in range(start, len(self.colours)) if self.colours[s] != WATCHED), len(self.colours))
            hits = [f for f in self.fired if start <= f < end]
            first = next((f for f in self.accepted if f >= start), None)
            if not hits:
                missed.append(start)
            elif first is not None and order.get(hits[0], 10**9) - order[first] < WITHIN:
                on_time.append(start)
            else:
                late.append(start)
        false = [f for f in self.fired if self.colours[f] != WATCHED]
        return on_time, late, missed, false

    def caption_line(self) -> str:
        """What the moments' captions cost (the server's ``/metrics.json`` memory counts)."""
        def grew(name: str) -> float:
            return float(self.memory_after.get(name, 0)) - float(self.memory_before.get(name, 0))

        written, skipped = grew("captions"), grew("captions_skipped")
        each = max(written, 1)
        return (f"captions: {written:.0f} written, {skipped:.0f} skipped; each {grew('caption_tokens_computed') / each:.1f} "
                f"prompt tokens computed past the warm prefix, {grew('caption_tokens_generated') / each:.1f} generated, "
                f"{grew('caption_seconds') * 1000 / each:.0f} ms from request to last token; "
                f"{grew('caption_seconds') / max(self.seconds, 1e-9):.2%} of the stream's time")

    def report(self) -> list[str]:
        a = self.asked
        on_time, late, missed, false = self.fires()
        lines = []
        if a:
            p50 = self.ttft(50)
            lines.append(f"time to first output over {len(a)} questions: p50 {p50:.1f} ms, p90 {self.ttft(90):.1f} ms, "
                         f"p99 {self.ttft(99):.1f} ms, max {max(x.ttft_ms for x in a):.1f} ms "
                         f"(p99 / p50 x{self.ttft(99) / max(p50, 1e-9):.2f})")
            lines.append(f"questions under {CACHED_ENOUGH:.0%} cached: {len(self.under_cached)} of {len(a)} "
                         f"(lowest share {min(x.cached_share for x in a):.1%}, median "
                         f"{statistics.median(x.cached_share for x in a):.1%})"
                         + "".join(f"; at {x.at_s:.0f} s {x.cached_share:.1%} ({x.ttft_ms:.0f} ms)"
                                   for x in self.under_cached[:5]))
        frame = self.frame_tokens
        lines.append(f"prefill work: {self.warm_per_frame:.1f} warm-prefix tokens computed per accepted frame, a "
                     f"frame's image tokens {frame:.1f} (x{self.warm_per_frame / max(frame, 1e-9):.2f}); checks "
                     f"{self.computed('check') / max(len(self.accepted), 1):.1f} and answers "
                     f"{self.computed('answer') / max(len(a), 1):.1f} tokens computed per frame / per question")
        lines.append(f"frames accepted {len(self.accepted)}, checks skipped {self.skipped}; red scenes "
                     f"{len(red_scenes(self.colours))}: fired within {WITHIN} accepted frames {len(on_time)}, late "
                     f"{len(late)}, missed {len(missed)}; false fires {len(false)}")
        if self.memory_after:
            lines.append(self.caption_line())
        rss = [x for x in a if x.rss_mib is not None]
        if rss:
            five = next((x for x in rss if x.at_s >= 300), rss[-1])
            lines.append(f"server RSS {rss[0].rss_mib:.1f} MiB at the first question, {five.rss_mib:.1f} at "
                         f"{five.at_s:.0f} s, {rss[-1].rss_mib:.1f} at the last ({rss[-1].at_s:.0f} s); KV cache tokens "
                         f"{rss[0].kv_tokens}, {five.kv_tokens}, {rss[-1].kv_tokens}")
        if self.errors:
            lines.append(f"errors: {', '.join(self.errors[:5])}")
        return lines


async def run_session(
    server: ServerAddress, frames: list[str], colours: list[str], *, fps: float | None, ask_every: float,
    max_frames: int | None = None, pid: int | None = None,
) -> Session:
    """Stream ``frames`` into one session on ``server`` with the red watch, asking ``QUESTION``
    every ``ask_every`` seconds (``fps`` given: frames at that rate) or every ``ask_every`` frames
    (``fps`` None: each frame sent once the one before it was checked or refused, the question
    answered before the next frame). ``pid``: the server's process, for its RSS."""
    from server.bench.process import rss_bytes

    config: dict = {"sampling": {"max_tokens": 4, "temperature": 0}, "watches": [WATCH]}
    if max_frames is not None:
        config["max_frames"] = max_frames
    seen = Session(colours)
    http = httpx.AsyncClient(base_url=server.http_url, timeout=30)
    conn, _ = await Connection.open(server.ws_url, config, open_timeout=120, compression=None)
    metrics = (await http.get("/metrics.json")).json()
    seen.engine_before, seen.memory_before = metrics["engine"], metrics.get("memory") or {}
    frame_done: dict[int, asyncio.Event] = {}
    answers: asyncio.Queue[tuple[float, int, ResponseDone]] = asyncio.Queue()
    pending: list[float] = []  # when each question not yet answered was sent
    first_text: dict[str, float] = {}
    used: dict[str, int] = {}  # request id -> frames its prompt held
    mine: dict[str, float] = {}  # request id -> when asked

    async def read() -> None:
        while True:
            event = (await conn.receive()).event
            now = time.perf_counter()
            if isinstance(event, FrameAck):
                frame = int(event.frame_id)
                if event.accepted:
                    seen.accepted.append(frame)
                else:
                    frame_done.setdefault(frame, asyncio.Event()).set()
            elif isinstance(event, WatchCheck):
                seen.checked.add(int(event.frame_id))
                frame_done.setdefault(int(event.frame_id), asyncio.Event()).set()
            elif isinstance(event, WatchFired):
                seen.fired.append(int(event.frame_id))
            elif isinstance(event, ResponseStart) and event.trigger is None and pending:
                mine[event.request_id] = pending.pop(0)
            elif isinstance(event, FramesConsumed) and event.request_id in mine:
                used[event.request_id] = len(event.frames)
            elif isinstance(event, ResponseTextDelta) and event.request_id in mine:
                first_text.setdefault(event.request_id, now)
            elif isinstance(event, ResponseDone) and event.request_id in mine:
                asked = mine.pop(event.request_id)
                answers.put_nowait((first_text.pop(event.request_id, now) - asked, used.pop(event.request_id, 0), event))
            elif isinstance(event, ErrorEvent):
                seen.errors.append(event.code)

    async def record(started: float) -> None:
        ttft_s, frames, done = await answers.get()
        rss = rss_bytes(pid) / 2**20 if pid is not None else None
        kv = (await http.get("/metrics.json")).json().get("kv_cache_tokens")
        usage = done.usage
        seen.asked.append(Asked(round(time.perf_counter() - started, 1), ttft_s * 1000, usage.prompt_tokens,
                                usage.cached_tokens, usage.image_tokens, frames, rss, kv))

    async def ask(started: float) -> None:
        pending.append(time.perf_counter())
        await conn.query(QUESTION)
        await record(started)

    try:
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(read())
            started = time.perf_counter()
            questions: list[asyncio.Task] = []
            for n, frame in enumerate(frames):
                if fps is not None:
                    await asyncio.sleep(max(0.0, started + n / fps - time.perf_counter()))
                    if n and int((n - 1) / fps / ask_every) != int(n / fps / ask_every):
                        questions.append(tg.create_task(ask(started)))
                elif n and n % int(ask_every) == 0:
                    await ask(started)
                done = frame_done.setdefault(n, asyncio.Event())
                await conn.send_frame(frame, frame_id=n, pts_ms=n * 1000 / (fps or 2.0))
                if fps is None:
                    await asyncio.wait_for(done.wait(), 300)
            await asyncio.gather(*questions)
            seen.seconds = time.perf_counter() - started
            await asyncio.sleep(0.5)  # the last check's fire, if any
            reader.cancel()
        metrics = (await http.get("/metrics.json")).json()
        seen.engine_after, seen.memory_after = metrics["engine"], metrics.get("memory") or {}
    finally:
        await conn.close()
        await http.aclose()
    return seen


# ---------------------------------------------------------------------- the run


@contextmanager
def engine_server(engine: str, model: str | None, log_dir: Path, *flags: str) -> Iterator[tuple[ServerAddress, int, str]]:
    """``livesight serve`` on ``engine`` (for ``openai``: in front of vLLM's own server, started
    here); ``model`` "colours" is the shipped colours model (Idefics3 on vLLM), None the random
    model of real size. Yields the server, its pid and what it serves."""
    from server.background import serve_process
    from server.bench.engine import VllmApiServer, tiny_idefics3
    from server.bench.served import bench_model
    from server.models.demo import shipped_model_dir

    mib = 1024 * 1024
    vllm_flags = ["--kv-cache-memory-bytes", str(512 * mib), "--enforce-eager", "--max-model-len", "16384"]
    if model == "colours":
        path = str(shipped_model_dir("idefics3") if engine != "transformers" else shipped_model_dir())
        about = f"the colours model ({Path(path).name})"
        vllm_flags += ["--dtype", "float32"]
    elif model is None and engine != "transformers":
        path = str(tiny_idefics3(log_dir / "model", 16384))
        about = "the random Idefics3 (256 tokens a frame)"
    else:
        path = bench_model(model)
        about = path if model else "the random model of real size"
    args = ["--log-level", "warning", *flags, "--model", path]
    if engine == "transformers":
        with serve_process(args, log_path=log_dir / "serve.log") as served:
            yield served, served.proc.pid, about
    elif engine == "vllm":
        with serve_process(["--engine", "vllm", *vllm_flags, *args], log_path=log_dir / "serve.log",
                           start_timeout_s=600) as served:
            yield served, served.proc.pid, about
    else:
        vllm = VllmApiServer(Path(path), 16384, 64, log_dir / "vllm.log")
        try:
            vllm.wait_ready()
            openai = ["--engine", "openai", "--openai-urls", f"{vllm.url}/v1", "--max-images-per-prompt", "64"]
            with serve_process([*openai, *args], log_path=log_dir / "serve.log") as served:
                yield served, served.proc.pid, about
        finally:
            vllm.stop()


def run_long(engine: str, model: str | None, minutes: float, fps: float, ask_every_s: float,
             max_frames: int | None, log_dir: Path) -> Session:
    """Serve ``engine``, stream one session for ``minutes``; prints the report and returns it."""
    frames_total = max(2, round(minutes * 60 * fps))
    colours = script(frames_total, max(1, round(SCENE_S * fps)))
    frames = clip(colours)
    with engine_server(engine, model, log_dir) as (served, pid, about):
        print(f"bench long: {minutes:g} min at {fps:g} fps on engine={engine}, {about}; max_frames "
              f"{max_frames or 'the default'}; a question every {ask_every_s:g} s; watch {WATCH['condition']!r} "
              f"(cooldown 0); scenes of {SCENE_S:g} s, grey and red", flush=True)
        seen = asyncio.run(run_session(served, frames, colours, fps=fps, ask_every=ask_every_s,
                                       max_frames=max_frames, pid=pid))
    for line in seen.report():
        print(line)
    print(json.dumps({"engine_after": seen.engine_after}, default=str)[:400])
    return seen
