"""Graceful shutdown: stop taking sessions, warn the open ones, let their answers finish.

uvicorn turns SIGTERM (and SIGINT) into ``Server.shutdown``. ``DrainingServer`` first closes
the listening sockets (new connections are refused by the kernel), then runs the app's drain
(every open session gets ``session.closing`` with its deadline, running answers finish, each
session closes with 1012 once idle or at the deadline), and only then lets uvicorn close what
is left and run the lifespan shutdown.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import anyio
import uvicorn

log = logging.getLogger("livesight.server")


class Drainable(Protocol):
    async def drain(self, timeout_s: float) -> None: ...


async def drain_sessions(sessions: Iterable[Drainable], timeout_s: float) -> None:
    """Drain every session at once; returns when all have closed (about ``timeout_s`` at most)."""
    open_sessions = list(sessions)
    log.info("draining %d sessions (up to %.3g s)", len(open_sessions), timeout_s)
    async with anyio.create_task_group() as tg:
        for session in open_sessions:
            tg.start_soon(session.drain, timeout_s)
    log.info("drained")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the app's drain between closing the listeners and closing connections."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the sessions drain
        for sock in sockets or []:
            sock.close()
        await self._drain()
        await super().shutdown(sockets)
