"""The one way blocking work (base64, hashing, image decoding, speech) leaves the event loop:
worker threads with bounded concurrency. Image work shares one limiter; a voice stage passes
its own (eSpeak is one global engine, a recogniser has a fixed pool of decoders)."""

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


async def run_blocking(
    fn: Callable[..., T], *args: object, limiter: anyio.CapacityLimiter | None = None, abandon_on_cancel: bool = False
) -> T:
    """Run ``fn(*args)`` in a worker thread under ``limiter`` (default: the shared image pool);
    returns its result, re-raises its exception. ``abandon_on_cancel``: a cancelled caller
    returns at once and the thread finishes alone (for long jobs whose result is not needed)."""
    global _limiter
    if limiter is None:
        if _limiter is None:
            _limiter = anyio.CapacityLimiter(_threads)
        limiter = _limiter
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=abandon_on_cancel)


def cancel_point() -> None:
    """Inside a job started by ``run_blocking``: raise the caller's cancellation if it was
    cancelled, so long jobs stop between small steps. Outside such a job: nothing."""
    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:
        pass  # not in a worker thread (a direct call, e.g. from a benchmark)
