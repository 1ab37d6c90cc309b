"""What the streams deliver, kept in a database until it is delivered, and the streams
themselves with the lease that says which server pulls each.

Every event of a stream (a watch fired, a fired watch's narration) is kept with its evidence
frames, and one delivery per event and channel (webhook, MQTT) that stays due until its
receiver took it. An event's ``seq`` orders the events (the Server-Sent Events' ids); its
``event_id`` is the receivers' idempotency key. Bounded: a stream keeps its newest
``max_events`` events (the rest go with their evidence and deliveries); a delivery still failing
``max_age_s`` after its event is given up (``delivery.py``).

The streams created through the API and those of the streams file are kept too (settings,
owner, a revision counted up by each change): a server pulls a stream while it holds its
*lease*, renewed every third of ``lease_s``, and takes the streams whose lease ran out, so
servers sharing one database (PostgreSQL, or one SQLite file) each pull a stream exactly
once, and a stream moves to another server when its own stops or dies. A delivery is claimed
for a while before it is tried (``due``), so two servers never try it at once.

Two backends of one interface: ``outbox_sqlite.py`` (a file in the data directory, the default)
and ``outbox_postgres.py`` (when ``memory_url`` names PostgreSQL: the servers share it);
``outbox_factory.py`` picks one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import anyio

@dataclass(frozen=True, slots=True)
class StreamEvent:
    seq: int
    event_id: str
    stream_id: str
    kind: str
    at_ms: float
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delivery:
    """A due delivery: the event, where it goes (``target``: a JSON object of the channel's
    settings), and how many times it was tried."""

    event: StreamEvent
    channel: str
    target: dict[str, Any]
    attempts: int


@dataclass(frozen=True, slots=True)
class KeptStream:
    """A stream as the database keeps it: ``holder`` pulls it while ``held`` (its lease runs);
    ``status`` is what the holder said of it at its last renewal; ``given``: from a streams file."""

    stream_id: str
    owner: str
    settings: dict[str, Any]
    revision: int
    holder: str | None
    held: bool
    status: dict[str, Any] | None
    given: bool


@dataclass(frozen=True, slots=True)
class Holding:
    """A lease round: the revisions of the streams this server still holds, those it took, and
    the seconds until the first lease another server holds runs out (None: none does)."""

    revisions: dict[str, int]
    taken: list[KeptStream]
    next_expiry_s: float | None = None


class Outbox(ABC):
    """The streams' events, deliveries and leases (see the module); every call is async and
    never blocks the event loop. ``added`` is set (and replaced) when any server keeps an event:
    the senders and Server-Sent Events readers wait on it."""

    backend = ""

    def __init__(self) -> None:
        self.added = anyio.Event()

    def _wake(self) -> None:
        self.added.set()
        self.added = anyio.Event()

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    # -------------------------------------------------------------------- events
    @abstractmethod
    async def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
                  evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        """Keep an event with its evidence and deliveries (None: ``event_id`` was kept before)."""

    @abstractmethod
    async def after(self, stream_id: str, seq: int, limit: int = 100) -> list[StreamEvent]:
        """A stream's events after ``seq``, oldest first."""

    @abstractmethod
    async def evidence(self, stream_id: str, event_id: str, n: int) -> bytes | None:
        """An event's evidence frame ``n`` (0: the frame that fired)."""

    # ---------------------------------------------------------------- deliveries
    @abstractmethod
    async def due(self, now_ms: float, limit: int, claim_ms: float) -> list[Delivery]:
        """Up to ``limit`` deliveries due at ``now_ms``, each claimed for ``claim_ms`` (due
        again after that, unless settled: a server that died while trying)."""

    @abstractmethod
    async def next_due_ms(self) -> float | None:
        """When the next pending delivery is due."""

    @abstractmethod
    async def settle(self, event_id: str, channel: str, state: str, due_ms: float, error: str | None = None) -> None:
        """A try's outcome: ``delivered``, ``abandoned``, or ``pending`` again at ``due_ms``."""

    @abstractmethod
    async def counts(self, stream_id: str) -> dict[str, int]:
        """A stream's deliveries by state."""

    # ------------------------------------------------------------------- streams
    @abstractmethod
    async def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any], holder: str | None,
                          lease_s: float) -> int:
        """Keep a stream's settings (a new one held by ``holder`` for ``lease_s``; a kept one's
        settings replaced, its holder kept); returns its revision."""

    @abstractmethod
    async def given_streams(self, streams: dict[str, dict[str, Any]]) -> None:
        """The streams of the streams file, by id: kept when new; those of an earlier file that
        are not in this one are forgotten."""

    @abstractmethod
    async def kept_streams(self) -> list[KeptStream]:
        """Every stream kept, in the order they were created."""

    @abstractmethod
    async def hold(self, holder: str, statuses: dict[str, dict[str, Any]], room: int, lease_s: float) -> Holding:
        """One lease round of ``holder``: renew the leases of the streams it pulls (``statuses``:
        what each is doing) and take up to ``room`` streams that nobody holds."""

    @abstractmethod
    async def release(self, holder: str) -> None:
        """``holder`` stops: its streams are free for the others at once."""

    @abstractmethod
    async def forget(self, stream_id: str) -> None:
        """A stream deleted: its events, evidence, deliveries and itself."""

