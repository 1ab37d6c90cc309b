"""One dedicated OS thread for an engine's model work, at a lower CPU priority.

On a machine with few cores the model would otherwise take the cores that intake needs:
with a hundred sessions streaming, warmups and answers keep the model busy all the time,
and every frame's decode and ack waits for a core behind it. The model thread lowers its
own scheduling priority (Linux: ``nice`` is per thread) before it does anything, so the
threads torch starts from it for its parallel work (OpenMP) are created at that priority
too. Intake, the event loop and the speech workers then come first; the model gets every
cycle they leave, so answers slow down under load instead of acks.

Jobs run one at a time, in the order they were given. A caller that is cancelled while its
job runs waits for the job to finish (a model step cannot be stopped half-way), then the
cancellation takes effect at the caller's next checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

log = logging.getLogger("livesight.engines")
T = TypeVar("T")

_STOP = object()


def lower_priority(nice: int) -> int:
    """Raise the calling thread's nice value by ``nice`` (Linux: per thread); returns the
    thread's nice value after. Where that cannot be done, logs it and changes nothing."""
    if nice <= 0:
        return os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError) as exc:
        log.warning("cannot lower the model thread's priority: %s", exc)
        return 0


class ModelThread:
    """A single worker thread that runs an engine's jobs in order, ``nice`` steps below
    the rest of the server."""

    def __init__(self, name: str = "livesight-model", nice: int = 0) -> None:
        self.name = name
        self.nice = nice
        self.native_id: int | None = None
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()

    def _work(self) -> None:
        self.native_id = threading.get_native_id()
        lower_priority(self.nice)
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args, loop, future = job
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, who decides
                _settle_soon(loop, future, None, exc)
            else:
                _settle_soon(loop, future, result, None)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the model thread; returns its result, re-raises its exception.
        Cancellation waits for the job to finish."""
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller gives no new job
        self._ensure_started()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, args, loop, future))
        with anyio.CancelScope(shield=True):
            await asyncio.wait([future])
        return future.result()

    def close(self) -> None:
        """Stop the thread once the jobs already given have run (it is a daemon: a server
        that exits does not wait for it)."""
        if self._thread is not None:
            self._jobs.put(_STOP)
            self._thread = None


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
