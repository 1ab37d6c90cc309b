"""The one way blocking work (base64, hashing, image decoding, speech) leaves the event loop:
worker threads with bounded concurrency. Image work shares one limiter; a voice stage passes
its own (eSpeak is one global engine).

Frame intake uses ``run_fair``: the shared image limiter hands its slots out in the order
they were asked for (anyio's limiters are FIFO), and each session asks for at most one slot
at a time, so sessions take turns (round robin) however many frames one of them sends.
Heavy images (large or PNG/WebP) also need a slot of a smaller pool, so they can never hold
every thread; and a job that cannot start before its deadline is not run (``Overloaded``):
the frame is shed with an answer instead of queued without bound.

Tried and reverted: a pool whose threads take the next job straight from a queue, without
the round trip through the event loop between jobs. It removed that hand-off's cost, but
under overload (200 sessions x 2 fps on 2 cores) the threads never paused, the event loop
got less of the GIL and the CPU, and reading the sockets fell behind (ack p99 460 ms
against 204 ms with the hand-off, same run): the hand-off is what keeps the loop first.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
# One image pool and one heavy pool per event loop: a limiter's waiters belong to the loop
# that made them, and tests run servers and clients on several loops in one process.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[anyio.CapacityLimiter, anyio.CapacityLimiter]] = (
    weakref.WeakKeyDictionary()
)
_threads = 2
# Frame jobs waiting for a slot or running, whole process (``frames_busy``).
_frame_jobs = 0
# Frames read from a client and not yet acknowledged, whole process (``frames_busy``).
_frames_unacked = 0


class Overloaded(Exception):
    """A job could not start before its deadline; it was not run."""


def configure(threads: int) -> None:
    """Set how many blocking jobs may run at once (call before the server starts)."""
    global _threads
    _threads = threads
    _pools.clear()


def _loop_pools() -> tuple[anyio.CapacityLimiter, anyio.CapacityLimiter]:
    loop = asyncio.get_running_loop()
    pools = _pools.get(loop)
    if pools is None:
        pools = _pools[loop] = (anyio.CapacityLimiter(_threads), anyio.CapacityLimiter(max(1, _threads - 1)))
    return pools


def _image_limiter() -> anyio.CapacityLimiter:
    return _loop_pools()[0]


def _heavy_limiter() -> anyio.CapacityLimiter:
    return _loop_pools()[1]


async def run_fair(fn: Callable[..., T], *args: object, deadline: float | None = None, heavy: bool = False) -> T:
    """Run ``fn(*args)`` on the image pool, taking turns with other callers (FIFO).

    ``deadline`` is a ``time.perf_counter()`` value: when no slot is free by then, the job
    is not run and ``Overloaded`` is raised. ``heavy``: the job also takes a slot of the
    heavy pool (one thread fewer than the image pool). Returns ``fn``'s result, re-raises
    its exception.
    """
    global _frame_jobs
    limiters = [_heavy_limiter(), _image_limiter()] if heavy else [_image_limiter()]
    held: list[anyio.CapacityLimiter] = []
    _frame_jobs += 1
    try:
        for limiter in limiters:
            timeout = None if deadline is None else deadline - time.perf_counter()
            with anyio.move_on_after(timeout) as scope:
                await limiter.acquire()
            if scope.cancelled_caught:
                raise Overloaded
            held.append(limiter)
        # The slot is held: the default thread pool only supplies the thread.
        return await anyio.to_thread.run_sync(fn, *args)
    finally:
        _frame_jobs -= 1
        for limiter in reversed(held):
            limiter.release()


def frames_busy() -> bool:
    """Whether a frame is read and not yet acknowledged, or a frame job is waiting for a slot
    or running (a hint for the model thread, which gives way to intake)."""
    return _frames_unacked > 0 or _frame_jobs > 0


def frame_read() -> None:
    """A frame was read and queued for its session (``frame_done`` when it is answered)."""
    global _frames_unacked
    _frames_unacked += 1


def frame_done(count: int = 1) -> None:
    """Frames counted by ``frame_read`` were acknowledged (or dropped with their session)."""
    global _frames_unacked
    _frames_unacked = max(0, _frames_unacked - count)


async def run_blocking(
    fn: Callable[..., T], *args: object, limiter: anyio.CapacityLimiter | None = None, abandon_on_cancel: bool = False
) -> T:
    """Run ``fn(*args)`` in a worker thread under ``limiter`` (default: the shared image pool);
    returns its result, re-raises its exception. ``abandon_on_cancel``: a cancelled caller
    returns at once and the thread finishes alone (for long jobs whose result is not needed)."""
    if limiter is None:
        limiter = _image_limiter()
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=abandon_on_cancel)


def cancel_point() -> None:
    """Inside a job started by ``run_blocking``: raise the caller's cancellation if it was
    cancelled, so long jobs stop between small steps. Outside such a job: nothing."""
    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:
        pass  # not in a worker thread (a direct call, e.g. from a benchmark)
