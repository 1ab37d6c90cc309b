"""The one way blocking work (base64, hashing, image decoding, speech) leaves the event loop:
worker threads with bounded concurrency. Frame intake has its own image threads; a voice
stage passes its own limiter (eSpeak is one global engine, a recogniser has a fixed pool of
decoders).

Frame intake uses ``run_fair``: the image threads (``configure``) take jobs in the order they
were asked for (one FIFO queue), and each session asks for at most one job at a time, so
sessions take turns (round robin) however many frames one of them sends. Heavy images (large
or PNG/WebP) also need a slot of a smaller pool, so they can never hold every thread; and a
job that cannot start before its deadline is not run (``Overloaded``): the frame is shed with
an answer instead of queued without bound. The queue hand-off is a plain executor, not
``anyio.to_thread``: it costs the event loop about half as much per frame.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import anyio

T = TypeVar("T")
# One image pool per event loop: a limiter's waiters belong to the loop that made them, and
# tests run servers and clients on several loops in one process.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ImagePool] = weakref.WeakKeyDictionary()
_threads = 2


class Overloaded(Exception):
    """A job could not start before its deadline; it was not run."""


class _ImagePool:
    """The image threads of one event loop (a FIFO queue), the heavy pool's limiter, and the
    limiter ``run_blocking`` uses by default."""

    def __init__(self, threads: int) -> None:
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="livesight-image")
        self.heavy = anyio.CapacityLimiter(max(1, threads - 1))
        self.limiter = anyio.CapacityLimiter(threads)

    def __del__(self) -> None:
        self.executor.shutdown(wait=False)


def configure(threads: int) -> None:
    """Set how many blocking jobs may run at once (call before the server starts)."""
    global _threads
    _threads = threads
    _pools.clear()


def _loop_pool() -> _ImagePool:
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = _ImagePool(_threads)
    return pool


def _image_limiter() -> anyio.CapacityLimiter:
    return _loop_pool().limiter


async def run_fair(fn: Callable[..., T], *args: object, deadline: float | None = None, heavy: bool = False) -> T:
    """Run ``fn(*args)`` on the image threads, taking turns with other callers (FIFO).

    ``deadline`` is a ``time.perf_counter()`` value: when the job has not started by then,
    it is not run and ``Overloaded`` is raised. ``heavy``: the job also takes a slot of the
    heavy pool (one thread fewer than the image threads). Returns ``fn``'s result, re-raises
    its exception. A cancelled caller waits for a job that already started.
    """
    pool = _loop_pool()
    if not heavy:
        return await _run_queued(pool.executor, fn, args, deadline)
    timeout = None if deadline is None else deadline - time.perf_counter()
    with anyio.move_on_after(timeout) as scope:
        await pool.heavy.acquire()
    if scope.cancelled_caught:
        raise Overloaded
    try:
        return await _run_queued(pool.executor, fn, args, deadline)
    finally:
        pool.heavy.release()


async def _run_queued(executor: ThreadPoolExecutor, fn: Callable[..., T], args: tuple, deadline: float | None) -> T:
    loop = asyncio.get_running_loop()
    job: Future[T] = executor.submit(fn, *args)
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = job.cancel()  # False once a thread has started it: then it runs

    timer = None if deadline is None else loop.call_later(max(0.0, deadline - time.perf_counter()), expire)
    try:
        return await asyncio.wrap_future(job, loop=loop)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if expired and (task is None or not task.cancelling()):
            raise Overloaded from None
        if not job.done():  # the caller was cancelled while the job runs: wait for it
            with anyio.CancelScope(shield=True):
                await asyncio.wait([asyncio.wrap_future(job, loop=loop)])
        raise
    finally:
        if timer is not None:
            timer.cancel()


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
