"""Frame intake: what a frame costs before it is buffered, and what bounds that cost.

- ``IntakeLimits``: the intake settings a session applies (read-ahead bytes, shedding
  deadline, image checks before decoding).
- ``ReadAhead``: bytes read from clients but not yet handled, counted for the whole server
  (each session also counts its own); a frame that does not fit is shed, not queued.
- ``Admission``: session slots, and the separate, bounded pool of connections that have not
  sent ``session.config`` yet, so silent connections cannot take the slots of real clients.
The frame itself is prepared off the loop by ``handlers.media.preparation``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import anyio

from handlers.media.preparation import ImageLimits

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IntakeLimits(ImageLimits):
    """Per-session intake limits (defaults match ``Settings``): the image checks, the
    read-ahead budget and the shedding deadline."""

    max_read_ahead_bytes: int = 32 * MiB
    intake_max_wait_ms: float = 25.0


class ReadAhead:
    """A byte budget for messages read but not yet handled (whole server)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes; False (nothing reserved) when they do not fit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        """Return bytes reserved by ``take``."""
        self.used = max(0, self.used - size)


#: New connections set up at once (handshake, then ``session.config`` to ``session.ready``).
SETUP_CONCURRENCY = 2


class Admission:
    """Session slots, the pool of connections still waiting for ``session.config``, and the
    turns new connections take to be set up.

    A connection waits in the pool (at most ``max_pending``; when it is full, the one that
    waited longest is pushed out) and claims a session slot only with a valid config.

    Setting a connection up (the WebSocket handshake, then the config's checks and
    ``session.ready``) runs on the event loop, ~2 ms each; a reconnect storm of a hundred
    connections all set up at once took every loop turn for a quarter of a second and
    delayed the acks of sessions already streaming by up to 168 ms. ``setting_up`` lets
    ``setups`` run at a time, so streaming sessions get the loop between them
    (``livesight bench storm``: 17-72 ms at worst).
    Waiting for the client's config is not a setup step: a silent client holds no turn.
    """

    def __init__(self, max_sessions: int, max_pending: int, setups: int = SETUP_CONCURRENCY) -> None:
        self.max_sessions = max_sessions
        self.max_pending = max_pending
        self.active: set[str] = set()
        self._pending: OrderedDict[str, anyio.CancelScope] = OrderedDict()
        self.pushed_out: set[str] = set()
        self._setups = anyio.Semaphore(setups)

    @asynccontextmanager
    async def setting_up(self) -> AsyncIterator[None]:
        """Hold one of the setup turns (see the class docstring)."""
        async with self._setups:
            yield

    @property
    def pending(self) -> int:
        return len(self._pending)

    @contextmanager
    def waiting(self, key: str) -> Iterator[anyio.CancelScope]:
        """Hold a place in the pending pool while the config is awaited; the yielded scope
        is cancelled when a newer connection pushes this one out (see ``pushed_out``)."""
        while len(self._pending) >= self.max_pending:
            oldest, scope = self._pending.popitem(last=False)
            self.pushed_out.add(oldest)
            scope.cancel()
        scope = anyio.CancelScope()
        self._pending[key] = scope
        try:
            with scope:
                yield scope
        finally:
            self._pending.pop(key, None)

    def was_pushed_out(self, key: str) -> bool:
        """True (once) when ``key`` lost its pending place to a newer connection."""
        if key in self.pushed_out:
            self.pushed_out.discard(key)
            return True
        return False

    def claim(self, key: str) -> bool:
        """Take a session slot; False when every slot is taken."""
        if len(self.active) >= self.max_sessions:
            return False
        self.active.add(key)
        return True

    def release(self, key: str) -> None:
        """Give back the slot (and any pending place) of ``key``."""
        self.active.discard(key)
        self.pushed_out.discard(key)


