"""Giving freed memory back to the operating system when sessions close.

A closed session's frames, decoded images and KV cache are freed at once, but glibc's
allocator keeps freed heap memory in its arenas (one per thread that allocated, up to
8 x cores) instead of returning it, so the process's RSS stayed where the busiest moment
left it. ``malloc_trim(0)`` returns the free pages of every arena; it walks the heap
(milliseconds), so it runs in a worker thread, once the last session has closed or at most
every ``TRIM_INTERVAL_S`` while sessions come and go. Without glibc (musl, macOS) it is a
no-op.

The full garbage collection before the trim runs only once the last session has closed: it
holds the GIL the whole time (43 ms measured with 100 sessions open), so while sessions
stream it would stall the event loop and every other session's acks. While sessions remain
open, the trim alone runs (ctypes releases the GIL) and the cycle collector's own passes
free what is left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import time
from collections.abc import Callable

import anyio

from handlers.media.pixel_pool import POOL

log = logging.getLogger("livesight.memory")

#: Least time between two trims while sessions are still open.
TRIM_INTERVAL_S = 10.0


def _libc(name: str, *argtypes: type) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The C library's function ``name`` (returning int), or None without glibc on Linux."""
    path = ctypes.util.find_library("c")
    if not path or not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(path, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


_malloc_trim = _libc("malloc_trim", ctypes.c_size_t)
_prctl = _libc("prctl", ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

#: prctl(2) options: refuse transparent huge pages for this process (inherited by its
#: children), and read that state back.
PR_SET_THP_DISABLE = 41
PR_GET_THP_DISABLE = 42


def set_huge_pages(allowed: bool) -> bool:
    """Allow or refuse transparent huge pages for this process (Linux; setting
    ``transparent_huge_pages``); returns whether the process now refuses them.

    numpy asks the kernel for huge pages (``madvise``) on every array of 4 MB or more, such
    as the model's preprocessed images; khugepaged then collapses such regions in the
    background, and each collapse holds the process's memory map lock: every thread of the
    server that faults a page in or maps memory waits for it. Measured under 100 streaming
    sessions: khugepaged ran 40-80 ms at a time, each time exactly when the acks of every
    session stalled. Refusing huge pages costs the server little (its large arrays are
    short-lived) and ends those stalls.
    """
    if _prctl is None:
        return False
    if _prctl(PR_SET_THP_DISABLE, 0 if allowed else 1, 0, 0, 0) != 0:
        log.warning("could not %s transparent huge pages: errno %d", "allow" if allowed else "refuse", ctypes.get_errno())
    return _prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1


def release_free_memory(collect: bool = True) -> bool:
    """Return free heap pages to the OS (after a full garbage collection when ``collect``);
    True if glibc trimmed."""
    if collect:
        gc.collect()
    POOL.clear()
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))


class MemoryReturn:
    """Decides when to give memory back: after the last session closes, or every
    ``TRIM_INTERVAL_S`` while sessions close."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S,
                 release: Callable[[bool], bool] | None = None) -> None:
        self.interval_s = interval_s
        self._release = release or release_free_memory  # (collect) -> trimmed; tests give their own
        self._last: float | None = None  # no trim yet (the monotonic clock may be near zero after a boot)
        self._running = False
        self._full_wanted = False  # the last session closed while a trim ran: one more, full
        self.trims = 0

    async def session_closed(self, remaining: int) -> None:
        """Call after a session has ended and released its buffers (``remaining``: sessions
        still open). The last one to close always gets a full collection and trim, even when
        it closes while an earlier trim is running."""
        if remaining and self._last is not None and time.monotonic() - self._last < self.interval_s:
            return
        self._full_wanted = self._full_wanted or remaining == 0
        if self._running:
            return
        self._running = True
        try:
            full = remaining == 0
            while True:
                self._full_wanted = False
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._release, full)
                self.trims += 1
                if not self._full_wanted:
                    break
                full = True
        finally:
            self._last = time.monotonic()
            self._running = False
