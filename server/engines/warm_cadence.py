"""How often one session may send a warm (prefix) request to an engine.

A session warms its prefix one request at a time: frames that arrive while a warm request runs
are covered together by the next one (the session never queues warm requests). On a fast
engine that still means one request per frame. ``WarmCadence`` bounds it: a warm request
occupies its session's warm slot for at least ``1 / max_per_s`` seconds, so at most
``max_per_s`` start each second and the frames that arrive during the rest are covered by the
following one. Cancelling the rest (a query arrives) is immediate.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class WarmCadence:
    """Paces a session's warm requests to at most ``max_per_s`` a second."""

    def __init__(self, max_per_s: float) -> None:
        if max_per_s <= 0:
            raise ValueError("max_per_s must be positive")
        self.interval_s = 1.0 / max_per_s

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Run one warm request; on the way out (success or ``EngineError``), wait out the rest
        of its interval. Cancellation is not delayed."""
        started = time.monotonic()
        try:
            yield
        except Exception:
            await self._rest(started)  # a failing server is not asked again at once either
            raise
        await self._rest(started)

    async def _rest(self, started: float) -> None:
        left = started + self.interval_s - time.monotonic()
        if left > 0:
            await anyio.sleep(left)
