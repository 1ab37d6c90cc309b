"""One dedicated OS thread for an engine's model work, whose compute threads run at a
lower CPU priority.

On a machine with few cores the model would otherwise take the cores that intake needs:
with a hundred sessions streaming, answers keep the model busy, and every frame's decode
and ack waits for a core behind it. Linux's ``nice`` is per thread and a new thread
inherits its creator's, so the model thread lowers its own priority, starts torch's
parallel workers (OpenMP) with ``start_workers``, then takes its own priority back. The
workers, which do most of the arithmetic and never hold the GIL, run below intake, the
event loop and the speech workers; the model thread itself, which runs Python (and so
holds the GIL), stays at the server's priority: a thread that holds the GIL and waits for
a core would stall every other thread of the server (measured: 5-60 ms garbage collections
run by a low-priority thread, and event-loop stalls of up to 85 ms). Where the model
thread may not take its priority back (no CAP_SYS_NICE), it does not lower it at all.

Jobs run one at a time, by ``Priority`` (the steps of answers first, then those of warm
prefixes, then watch checks), each priority in the order its jobs were given: a question waits
for the step under way, never behind a queue of other sessions' warmups and checks. A check
that has waited ``CHECK_AGE_S`` takes its turn with the warm prefixes, in the order given:
with more sessions warming than the model keeps up with (many cameras), checks still run. A caller
that is cancelled while its job runs waits for the job to finish (a model step cannot be
stopped half-way), then the cancellation takes effect at the caller's next checkpoint; a
job that has not started when its caller is cancelled is dropped, so a cancelled warmup or
check never keeps its session waiting behind other sessions' answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

log = logging.getLogger("livesight.engines")
T = TypeVar("T")

_STOP = object()


class Priority(IntEnum):
    """Which jobs a model thread runs first: the lowest value waiting."""

    ANSWER = 0  # a question's prefill and decoding steps (and anything not told otherwise)
    WARMUP = 1  # a warm prefix's steps
    CHECK = 2  # a watch check's steps
    STOP = 3  # closing: after every job given before it at a higher priority


#: How long a check waits behind warm prefixes before it goes in turn with them.
CHECK_AGE_S = 0.5

#: How often a yielding model thread looks again.
YIELD_POLL_S = 0.0005


def start_low_priority_workers(nice: int, start_workers: Callable[[], object]) -> int:
    """In the calling thread: run ``start_workers`` (which creates the threads to lower) at
    ``nice`` steps below this thread's priority, then take this thread's priority back.
    Returns the workers' nice value, or this thread's when nothing was lowered (``nice`` 0,
    not Linux, or no permission to take the priority back)."""
    tid = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, tid)
    if nice <= 0:
        start_workers()
        return base
    if not _may_raise_priority():
        log.warning("model_nice ignored: this process may not raise a thread's priority back (CAP_SYS_NICE)")
        start_workers()
        return base
    lowered = min(19, base + nice)
    os.setpriority(os.PRIO_PROCESS, tid, lowered)
    try:
        start_workers()
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, base)
    return lowered


def _may_raise_priority() -> bool:
    """Whether a thread of this process may lower its nice value again (tried on a
    throwaway thread, so no thread that matters can be left behind at a low priority)."""
    allowed: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            base = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + 1))
            os.setpriority(os.PRIO_PROCESS, tid, base)
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=probe, name="livesight-nice-probe")
    thread.start()
    thread.join()
    return allowed == [True]


@dataclass(eq=False)
class _Job:
    """A job given to the model thread; ``state`` (under the thread's lock) says whether it
    waits, runs or was dropped by its cancelled caller."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    state: str = "waiting"  # "running", "dropped"


class ModelThread:
    """A single thread that runs an engine's jobs by priority, in order within each;
    ``start_workers`` (run first, on
    this thread) starts the compute threads, which run ``nice`` steps below the server."""

    def __init__(
        self, name: str = "livesight-model", nice: int = 0, start_workers: Callable[[], object] = lambda: None,
        yield_to: Callable[[], bool] | None = None, max_yield_s: float = 0.0,
    ) -> None:
        self.name = name
        self.yield_to = yield_to
        self.max_yield_s = max_yield_s
        self.nice = nice
        self.start_workers = start_workers
        self.native_id: int | None = None
        self.workers_nice: int | None = None  # the compute threads' nice value, once started
        self._waiting: dict[Priority, deque[tuple[float, Any]]] = {p: deque() for p in Priority}
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a job's state: taken by the thread, or dropped by its caller

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()

    def _work(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            self.workers_nice = start_low_priority_workers(self.nice, self.start_workers)
        except Exception:  # the jobs still run; only the priorities are as they were
            log.exception("starting the model's workers failed")
        while True:
            job = self._take()
            if job is _STOP:
                return
            with self._lock:
                if job.state == "dropped":
                    continue
                job.state = "running"
            self._give_way()
            try:
                result = job.fn(*job.args)
            except BaseException as exc:  # handed to the caller, who decides
                _settle_soon(job.loop, job.future, None, exc)
            else:
                _settle_soon(job.loop, job.future, result, None)

    def _take(self) -> Any:
        """The next job: answers first; then warm prefixes, unless the oldest check has waited
        ``CHECK_AGE_S`` and is older than the oldest warm prefix; then checks; then the stop."""
        with self._ready:
            while not any(self._waiting.values()):
                self._ready.wait()
            answers, warm, checks = (self._waiting[p] for p in (Priority.ANSWER, Priority.WARMUP, Priority.CHECK))
            if answers:
                return answers.popleft()[1]
            if checks and (not warm or (time.monotonic() - checks[0][0] >= CHECK_AGE_S and checks[0][0] < warm[0][0])):
                return checks.popleft()[1]
            if warm:
                return warm.popleft()[1]
            return self._waiting[Priority.STOP].popleft()[1]

    def _put(self, priority: Priority, job: Any) -> None:
        with self._ready:
            self._waiting[priority].append((time.monotonic(), job))
            self._ready.notify()

    def _give_way(self) -> None:
        """Before a step: while ``yield_to`` says other work is waiting (frames being
        decoded), wait, up to ``max_yield_s``, holding neither a core nor the GIL."""
        if self.yield_to is None or self.max_yield_s <= 0:
            return
        until = time.monotonic() + self.max_yield_s
        while self.yield_to() and time.monotonic() < until:
            time.sleep(YIELD_POLL_S)

    async def run(self, fn: Callable[..., T], *args: Any, priority: Priority = Priority.ANSWER) -> T:
        """Run ``fn(*args)`` on the model thread, after the jobs waiting at a higher
        ``priority`` (and those given earlier at this one); returns its result, re-raises its
        exception. Cancellation drops the job if it has not started, else waits for it to finish."""
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller gives no new job
        self._ensure_started()
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop, loop.create_future())
        self._put(priority, job)
        try:
            await asyncio.wait([job.future])
        except BaseException:  # cancelled
            with self._lock:
                started = job.state == "running"
                if not started:
                    job.state = "dropped"  # the thread passes over it
            if started:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([job.future])
            raise
        return job.future.result()

    def close(self) -> threading.Thread | None:
        """Stop the thread once the jobs already given have run (it is a daemon: a server
        that exits does not wait for it); returns it, for a caller that will join it."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._put(Priority.STOP, _STOP)
        return thread


def _settle_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
                 exc: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, exc)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for this job any more


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
