"""When freed memory goes back to the OS (``server/process_memory.py``): a full collection only once the
last session has closed, never while others stream, and never skipped for the last one."""

from __future__ import annotations

import threading

import anyio
import pytest

from server import process_memory as memory
from server.process_memory import MemoryReturn

pytestmark = pytest.mark.anyio


@pytest.fixture
def releases() -> list[bool]:
    """Each release of the test's own ``MemoryReturn`` (``recording``), as its ``collect``
    argument (nothing is trimmed; a server another module left running trims on its own)."""
    return []


def recording(calls: list[bool], interval_s: float) -> MemoryReturn:
    return MemoryReturn(interval_s=interval_s, release=lambda collect=True: calls.append(collect) or False)


async def test_no_full_collection_while_sessions_remain(releases: list[bool]) -> None:
    """Sessions closing while others remain only trim; the last one gets the full collection."""
    ret = recording(releases, interval_s=0)
    await ret.session_closed(remaining=5)
    await ret.session_closed(remaining=4)
    await ret.session_closed(remaining=0)
    assert releases == [False, False, True]


async def test_trims_while_sessions_remain_at_most_once_per_interval(releases: list[bool]) -> None:
    """The first close trims at once (even right after boot), later ones not within the interval; the last always."""
    ret = recording(releases, interval_s=3600)
    for remaining in (9, 8, 7):
        await ret.session_closed(remaining=remaining)
    assert releases == [False]
    await ret.session_closed(remaining=0)  # the last one: whatever the interval
    assert releases == [False, True]


async def test_last_session_closing_during_a_trim_still_gets_a_full_one() -> None:
    """The last session closing while a trim runs is not lost: its full collection follows."""
    started, finish = threading.Event(), threading.Event()
    calls: list[bool] = []

    def slow_release(collect: bool = True) -> bool:
        calls.append(collect)
        started.set()
        finish.wait(10)
        return False

    ret = MemoryReturn(interval_s=0, release=slow_release)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ret.session_closed, 3)
        await anyio.to_thread.run_sync(started.wait, 10)
        await ret.session_closed(remaining=0)  # returns at once: a trim is running
        finish.set()
    assert calls == [False, True]


def test_the_server_refuses_transparent_huge_pages_unless_allowed() -> None:
    """transparent_huge_pages reaches the process: off (the default) the kernel reports THP
    disabled for it (``/proc/self/status``), on it is allowed again (building the app is
    enough: the engine loads only when the app starts)."""
    from server.app import create_app
    from server.settings import Settings

    def thp_enabled() -> str:
        for line in open("/proc/self/status"):
            if line.startswith("THP_enabled:"):
                return line.split()[1]
        raise AssertionError("this kernel reports no THP_enabled in /proc/self/status")

    try:
        create_app(Settings(transparent_huge_pages=True))
        assert thp_enabled() == "1"
        create_app(Settings())
        assert thp_enabled() == "0"
    finally:
        memory.set_huge_pages(False)  # as every server of this test process has it
