"""The one way blocking work (base64, hashing, image decoding, speech) leaves the event loop:
worker threads with bounded concurrency.

Frame intake uses ``run_fair`` and its own pool of ``decode_threads`` threads (``FramePool``).
Its threads take jobs straight from one FIFO queue: a thread that finishes a job starts the
next at once, without a round trip through the event loop (under load, that hand-off cost
as much wall time as the decode itself and left the threads idle). Each session asks for at
most one job at a time, so the FIFO makes sessions take turns (round robin) however many
frames one of them sends. Heavy images (large or PNG/WebP) run on at most one thread fewer
than the pool has, so they can never hold every thread; a job that has not started by its
deadline is not run (``Overloaded``): the frame is shed with an answer instead of queued
without bound.

Other blocking work (speech) uses ``run_blocking`` on anyio's threads, each stage with its
own limiter.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

_PENDING, _RUNNING, _ABANDONED = 0, 1, 2


class Overloaded(Exception):
    """A job could not start before its deadline; it was not run."""


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    heavy: bool
    order: int
    state: int = field(default=_PENDING)


class FramePool:
    """``threads`` worker threads that run frame jobs in the order they were given, heavy
    ones on at most ``threads - 1`` of them (at least one)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.heavy_limit = max(1, threads - 1)
        self._cond = threading.Condition()
        self._light: deque[_Job] = deque()
        self._heavy: deque[_Job] = deque()
        self._heavy_running = 0
        self._running = 0
        self._order = itertools.count()
        self._workers: list[threading.Thread] = []
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None, heavy: bool = False) -> T:
        """Run ``fn(*args)`` on a pool thread; returns its result, re-raises its exception.

        ``deadline`` (a ``time.perf_counter()`` value): a job not started by then is not run
        and ``Overloaded`` is raised. A caller cancelled before its job started takes it out
        of the queue; one cancelled while its job runs waits for the job to finish.
        """
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop, loop.create_future(), heavy, 0)
        with self._cond:
            job.order = next(self._order)
            (self._heavy if heavy else self._light).append(job)
            self._start_workers()
            self._cond.notify()
        timer = None if deadline is None else loop.call_later(deadline - time.perf_counter(), self._expire, job)
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.future.done() and not self._abandon(job):
                with anyio.CancelScope(shield=True):  # it runs: nothing outlives its caller
                    await asyncio.wait([job.future])
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, job: _Job) -> None:
        """The deadline passed: a job that has not started is not run."""
        if not job.future.done() and self._abandon(job):
            job.future.set_exception(Overloaded())

    def _abandon(self, job: _Job) -> bool:
        """Take a job that has not started out of the queue; False when it already runs."""
        with self._cond:
            if job.state != _PENDING:
                return False
            job.state = _ABANDONED
            (self._heavy if job.heavy else self._light).remove(job)
            return True

    def _start_workers(self) -> None:
        while len(self._workers) < self.threads:
            worker = threading.Thread(target=self._work, name=f"livesight-frames-{len(self._workers)}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _next(self) -> _Job | None:
        """The oldest job a free thread may take (called holding the condition)."""
        light = self._light[0] if self._light else None
        heavy = self._heavy[0] if self._heavy and self._heavy_running < self.heavy_limit else None
        job = light if heavy is None or (light is not None and light.order < heavy.order) else heavy
        if job is not None:
            (self._heavy if job.heavy else self._light).popleft()
            job.state = _RUNNING
            self._running += 1
            self._heavy_running += job.heavy
        return job

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._next()
                while job is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    job = self._next()
            try:
                result, error = job.fn(*job.args), None
            except BaseException as exc:  # handed to the caller, who decides
                result, error = None, exc
            with self._cond:
                self._running -= 1
                if job.heavy:
                    self._heavy_running -= 1
                    self._cond.notify()
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            except RuntimeError:
                pass  # the caller's loop is closed: nobody waits for this job

    def busy(self) -> bool:
        """Whether a job is queued or running (read without the lock: a hint)."""
        return bool(self._running or self._light or self._heavy)

    def close(self) -> None:
        """Let the threads end once the queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


_pool = FramePool(2)
# anyio's limiters belong to the event loop that made them, and tests run servers and
# clients on several loops in one process: one default limiter per loop for run_blocking.
_limiters: dict[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = {}


def configure(threads: int) -> None:
    """Set how many frame jobs may run at once (call before the server starts)."""
    global _pool
    if threads != _pool.threads:
        _pool.close()
        _pool = FramePool(threads)


async def run_fair(fn: Callable[..., T], *args: object, deadline: float | None = None, heavy: bool = False) -> T:
    """Run ``fn(*args)`` on the frame pool (``FramePool.run``), taking turns with other
    callers (FIFO)."""
    return await _pool.run(fn, *args, deadline=deadline, heavy=heavy)


def frames_busy() -> bool:
    """Whether the frame pool has a job queued or running (a hint, read without a lock)."""
    return _pool.busy()


def _default_limiter() -> anyio.CapacityLimiter:
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        for closed in [other for other in _limiters if other.is_closed()]:
            del _limiters[closed]
        limiter = _limiters[loop] = anyio.CapacityLimiter(_pool.threads)
    return limiter


async def run_blocking(
    fn: Callable[..., T], *args: object, limiter: anyio.CapacityLimiter | None = None, abandon_on_cancel: bool = False
) -> T:
    """Run ``fn(*args)`` in a worker thread under ``limiter`` (default: ``decode_threads`` at once);
    returns its result, re-raises its exception. ``abandon_on_cancel``: a cancelled caller
    returns at once and the thread finishes alone (for long jobs whose result is not needed)."""
    if limiter is None:
        limiter = _default_limiter()
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=abandon_on_cancel)


def cancel_point() -> None:
    """Inside a job started by ``run_blocking``: raise the caller's cancellation if it was
    cancelled, so long jobs stop between small steps. Outside such a job: nothing."""
    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:
        pass  # not in a worker thread (a direct call, e.g. from a benchmark)
