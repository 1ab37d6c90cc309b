"""Session resume: sessions whose connection dropped wait here for their client to return.

When a connection drops (no close frame, or any close code but 1000), the session's core
(frame buffer, conversation, config, audio) is parked under its resume token instead of being
freed, and the engine keeps its cache for the same session id. A client that reconnects within
the grace period and sends ``session.config`` with that token gets it back. The lot is bounded:
when it is full the oldest parked session is released; a sweeper releases expired ones.

A token is a secret: 32 random bytes, stored only as a digest, single use (a resumed session
gets a new one), and bound to the API key that opened the session (compared in constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from handlers.core.events import SessionReady
from handlers.core.machine import SessionMachine
from handlers.wire.errors import ErrorCode, SessionError


def digest(secret: str | None) -> str:
    """A stable, one-way name for a secret (a token, an API key); "" for none."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest() if secret else ""


@dataclass
class ParkedSession:
    """A session without a connection, as its client left it."""

    session_id: str
    core: SessionMachine
    owner: str  # digest of the API key that opened it ("" when keys are off)
    ready: SessionReady  # what the client was told at the start (resume repeats it)
    expires_at: float = 0.0


class ParkingLot:
    """At most ``capacity`` parked sessions, each for ``grace_s`` seconds.

    ``release`` frees a session for good (its buffers and its engine cache); the lot calls it
    for sessions it evicts, expires or clears.
    """

    def __init__(
        self, grace_s: float, capacity: int, release: Callable[[ParkedSession], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s = grace_s
        self.capacity = capacity
        self._release = release
        self._clock = clock
        self._parked: OrderedDict[str, ParkedSession] = OrderedDict()  # token digest -> session, oldest first

    def __len__(self) -> int:
        return len(self._parked)

    @staticmethod
    def new_token() -> str:
        """A fresh, unguessable resume token."""
        return secrets.token_urlsafe(32)

    async def park(self, token: str, parked: ParkedSession) -> None:
        """Keep ``parked`` under ``token`` for the grace period (the oldest goes when full)."""
        parked.expires_at = self._clock() + self.grace_s
        self._parked[digest(token)] = parked
        while len(self._parked) > self.capacity:
            _, oldest = self._parked.popitem(last=False)
            await self._release(oldest)

    def claim(self, token: str, owner: str) -> ParkedSession:
        """Take the session parked under ``token`` for a client presenting ``owner``'s key.

        Raises ``resume_failed`` (unknown, expired, or another key's token: one message for all,
        so a guess learns nothing).
        """
        key = digest(token)
        parked = self._parked.get(key)
        if parked is None or parked.expires_at <= self._clock() or not hmac.compare_digest(parked.owner, owner):
            raise SessionError(
                ErrorCode.RESUME_FAILED, "the resume token is unknown or expired; this is a new session"
            )
        del self._parked[key]
        return parked

    async def sweep(self) -> None:
        """Release every session whose grace period is over."""
        now = self._clock()
        for key, parked in list(self._parked.items()):
            if parked.expires_at <= now:
                del self._parked[key]
                await self._release(parked)

    async def clear(self) -> None:
        """Release every parked session (server shutdown)."""
        while self._parked:
            _, parked = self._parked.popitem(last=False)
            await self._release(parked)
