"""The embedded engine's model thread: jobs by priority (answers, warmups, checks), in order
within each; cancellation waits for a running step and drops one that has not started; and
each step gives way to frame decoding for at most ``max_yield_s``."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from server import blocking
from server.engines.model_thread import ModelThread, Priority

pytestmark = pytest.mark.anyio


async def test_jobs_run_in_order_on_one_thread() -> None:
    """Every job runs on the same thread, in the order given (one priority), and returns its result."""
    thread = ModelThread()
    try:
        seen: list[tuple[int, int]] = []
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(thread.run, lambda i=i: seen.append((i, threading.get_ident())))
                await anyio.sleep(0)
        assert [i for i, _ in seen] == list(range(5)) and len({t for _, t in seen}) == 1
        assert await thread.run(lambda: 41 + 1) == 42
        with pytest.raises(ZeroDivisionError):
            await thread.run(lambda: 1 / 0)
    finally:
        thread.close()


async def test_waiting_jobs_run_by_priority_then_in_order() -> None:
    """Jobs given while the thread is busy run answers first, then warmups, then checks, each
    priority in the order given."""
    thread = ModelThread()
    busy = threading.Event()
    seen: list[str] = []
    try:
        await thread.run(lambda: None)  # the thread is up
        async with anyio.create_task_group() as tg:
            tg.start_soon(thread.run, busy.wait)
            await anyio.sleep(0.05)
            for name, priority in [("check1", Priority.CHECK), ("warm1", Priority.WARMUP),
                                   ("answer1", Priority.ANSWER), ("check2", Priority.CHECK),
                                   ("answer2", Priority.ANSWER), ("warm2", Priority.WARMUP)]:
                tg.start_soon(lambda n=name, p=priority: thread.run(seen.append, n, priority=p))
                await anyio.sleep(0.01)
            busy.set()
        assert seen == ["answer1", "answer2", "warm1", "warm2", "check1", "check2"]
    finally:
        busy.set()
        thread.close()


async def test_a_check_that_waited_goes_in_turn_with_the_warmups() -> None:
    """Behind a stream of warmups (more sessions warming than the model keeps up with), a check
    that has waited CHECK_AGE_S runs before the warmups given after it, not after all of them;
    answers still come first."""
    from server.engines import model_thread

    thread = ModelThread()
    busy = threading.Event()
    seen: list[str] = []
    try:
        await thread.run(lambda: None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(thread.run, busy.wait)
            await anyio.sleep(0.02)
            tg.start_soon(lambda: thread.run(seen.append, "warm0", priority=Priority.WARMUP))
            await anyio.sleep(0.01)
            tg.start_soon(lambda: thread.run(seen.append, "check", priority=Priority.CHECK))
            await anyio.sleep(model_thread.CHECK_AGE_S + 0.05)
            for name, priority in [("warm1", Priority.WARMUP), ("answer", Priority.ANSWER)]:
                tg.start_soon(lambda n=name, p=priority: thread.run(seen.append, n, priority=p))
                await anyio.sleep(0.01)
            busy.set()
        assert seen == ["answer", "warm0", "check", "warm1"]
    finally:
        busy.set()
        thread.close()


async def test_cancelled_caller_drops_a_job_that_has_not_started() -> None:
    """A caller cancelled while its job waits behind others returns at once, and the job never
    runs; the jobs around it run as given."""
    thread = ModelThread()
    busy = threading.Event()
    seen: list[str] = []
    try:
        await thread.run(lambda: None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(thread.run, busy.wait)
            await anyio.sleep(0.05)
            with anyio.move_on_after(0.05) as scope:
                await thread.run(seen.append, "dropped", priority=Priority.CHECK)
            assert scope.cancelled_caught and not busy.is_set()  # it returned while the thread was busy
            tg.start_soon(thread.run, seen.append, "after")
            await anyio.sleep(0.01)
            busy.set()
        assert seen == ["after"]
    finally:
        busy.set()
        thread.close()


async def test_cancelled_caller_waits_for_its_step() -> None:
    """A caller cancelled while its step runs returns only once the step has finished."""
    thread = ModelThread()
    finished: list[bool] = []

    def step() -> None:
        time.sleep(0.2)
        finished.append(True)

    try:
        with anyio.move_on_after(0.05):
            await thread.run(step)
        assert finished == [True]
    finally:
        thread.close()


async def test_step_gives_way_to_frame_decoding_but_not_forever() -> None:
    """While frames decode, a model step waits (not past max_yield_s); with the pool idle it starts at once."""
    blocking.configure(1)
    thread = ModelThread(yield_to=blocking.frames_busy, max_yield_s=0.5)
    try:
        await thread.run(lambda: None)  # the thread is up
        asked = time.perf_counter()
        await thread.run(lambda: None)
        idle_start = time.perf_counter() - asked

        decoded: list[float] = []

        def decode() -> None:
            time.sleep(0.15)
            decoded.append(time.perf_counter())

        started: list[float] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocking.run_fair, decode)
            await anyio.sleep(0.02)
            await thread.run(lambda: started.append(time.perf_counter()))
        assert started[0] >= decoded[0]  # the step waited for the decode
        assert idle_start < 0.05

        hog = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocking.run_fair, hog.wait, 5)
            await anyio.sleep(0.02)
            asked = time.perf_counter()
            await thread.run(lambda: None)
            waited = time.perf_counter() - asked
            hog.set()
        assert 0.4 < waited < 2.0  # gave way for max_yield_s, then ran anyway
    finally:
        thread.close()
        blocking.configure(2)
