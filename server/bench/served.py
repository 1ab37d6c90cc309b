"""The server under test, as the benchmarks start and watch it: its command line, and waits
on its ``/metrics.json`` until it has settled."""

from __future__ import annotations

import asyncio
import time

import httpx


def bench_model(model: str | None) -> str:
    """The model a benchmark serves: ``model`` when one is given, else the tiny random-weight
    model (generated once), whose frames have a real model's shapes (the demo model's frames
    are a few tokens each)."""
    from server.models.demo import resolve_random_model
    from server.settings import Settings

    return model or resolve_random_model(Settings())


def serve_args(model: str | None, *flags: str) -> list[str]:
    """``livesight serve`` flags for a benchmark: warnings only, ``flags``, and ``--model``
    (``bench_model``)."""
    return ["--log-level", "warning", *flags, "--model", bench_model(model)]


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 600) -> None:
    """Wait until no session has a decode, warmup or answer running. Raises ``TimeoutError``."""
    deadline = time.monotonic() + timeout_s
    while (await http.get("/metrics.json")).json()["sessions_busy"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not settle")
        await asyncio.sleep(0.02)


def wait_sessions_closed(http_url: str, timeout_s: float = 30) -> bool:
    """Wait until the server holds no session; returns False when some are left at the timeout."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(http_url + "/metrics.json", timeout=10).json()["sessions"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def event_loop_lag_ms(http_url: str) -> float:
    """The server event loop's worst lag since the last read (reading starts a new window)."""
    return httpx.get(http_url + "/metrics.json", timeout=10).json()["event_loop_lag_max_ms"]
