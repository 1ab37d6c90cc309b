"""The one way blocking work (base64, hashing, image decoding) leaves the event loop:
a thread pool shared by all sessions, with bounded concurrency."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
_limiter: anyio.CapacityLimiter | None = None
_threads = 2


def configure(threads: int) -> None:
    """Set how many blocking jobs may run at once (call before the server starts)."""
    global _threads, _limiter
    _threads = threads
    _limiter = None


async def run_blocking(fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` on the shared pool; returns its result, re-raises its exception."""
    global _limiter
    if _limiter is None:
        _limiter = anyio.CapacityLimiter(_threads)
    return await anyio.to_thread.run_sync(fn, *args, limiter=_limiter)
