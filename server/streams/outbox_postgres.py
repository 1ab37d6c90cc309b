"""The outbox in PostgreSQL (schema ``livesight``, beside the session memory), through a small
asyncpg pool: the servers sharing the database share their streams.

Leases are timed by the database's clock (``clock_timestamp()``), so the servers' clocks need
not agree. A lease round renews this server's leases in one statement and takes free streams
with ``FOR UPDATE SKIP LOCKED``, as ``due`` claims deliveries: two servers never take the same
row. Each kept event is announced with ``NOTIFY livesight_stream_events``; every server listens
on a connection of its own, so a Server-Sent Events reader on one server hears the events of a
stream another pulls (and, if that connection drops, still reads them at its keepalive)."""

from __future__ import annotations

import json
import logging
from typing import Any

import asyncpg

from server.streams.outbox import Delivery, Holding, KeptStream, Outbox, StreamEvent
from server.postgres_pool import open_pool

log = logging.getLogger("livesight.streams")

#: The advisory lock key of the schema's creation (apart from the memory store's).
_SCHEMA_LOCK = 0x73747265616D73  # "streams"
NOTIFY_CHANNEL = "livesight_stream_events"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS livesight;
CREATE TABLE IF NOT EXISTS livesight.stream_events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    stream_id text NOT NULL,
    kind text NOT NULL,
    at_ms double precision NOT NULL,
    body text NOT NULL
);
CREATE INDEX IF NOT EXISTS stream_events_by_stream ON livesight.stream_events (stream_id, seq);
CREATE TABLE IF NOT EXISTS livesight.stream_evidence (
    event_id text NOT NULL REFERENCES livesight.stream_events (event_id) ON DELETE CASCADE,
    n integer NOT NULL,
    at_ms double precision NOT NULL,
    jpeg bytea NOT NULL,
    PRIMARY KEY (event_id, n)
);
ALTER TABLE livesight.stream_evidence ALTER COLUMN jpeg SET STORAGE EXTERNAL;
CREATE TABLE IF NOT EXISTS livesight.stream_deliveries (
    event_id text NOT NULL REFERENCES livesight.stream_events (event_id) ON DELETE CASCADE,
    channel text NOT NULL,
    target text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    due_ms double precision NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    last_error text,
    PRIMARY KEY (event_id, channel)
);
CREATE INDEX IF NOT EXISTS stream_deliveries_due ON livesight.stream_deliveries (state, due_ms);
CREATE TABLE IF NOT EXISTS livesight.streams (
    created bigint GENERATED ALWAYS AS IDENTITY,
    stream_id text PRIMARY KEY,
    owner text NOT NULL,
    settings text NOT NULL,
    revision integer NOT NULL DEFAULT 1,
    holder text,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    status text,
    given boolean NOT NULL DEFAULT false
);
"""

_EVENT = "e.seq, e.event_id, e.stream_id, e.kind, e.at_ms, e.body"
_KEPT = ("SELECT stream_id, owner, settings, revision, holder,"
         " holder IS NOT NULL AND lease_until > clock_timestamp() AS held, status, given FROM livesight.streams")
_LEASE = "clock_timestamp() + make_interval(secs => $2)"


def _event(row: asyncpg.Record) -> StreamEvent:
    return StreamEvent(row["seq"], row["event_id"], row["stream_id"], row["kind"], row["at_ms"], json.loads(row["body"]))


def _kept(row: asyncpg.Record) -> KeptStream:
    return KeptStream(row["stream_id"], row["owner"], json.loads(row["settings"]), row["revision"], row["holder"],
                      bool(row["held"]), json.loads(row["status"]) if row["status"] else None, row["given"])


class PostgresOutbox(Outbox):
    """The outbox in PostgreSQL (see the module)."""

    backend = "postgresql"

    def __init__(self, url: str, max_events: int, max_connections: int = 4) -> None:
        super().__init__()
        self.url = url
        self.max_events = max_events
        self.max_connections = max_connections
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL stream outbox is not open")
        return self._pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        pool = await open_pool(self.url, self.max_connections, _SCHEMA_LOCK, lambda db: db.execute(SCHEMA))
        try:
            self._listener = await asyncpg.connect(self.url)
            await self._listener.add_listener(NOTIFY_CHANNEL, self._notified)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    def _notified(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        self._wake()

    async def close(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # ------------------------------------------------------------------ events
    async def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
                  evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        async with self.pool.acquire() as db, db.transaction():
            seq = await db.fetchval(
                "INSERT INTO livesight.stream_events (event_id, stream_id, kind, at_ms, body) VALUES ($1, $2, $3, $4, $5)"
                " ON CONFLICT (event_id) DO NOTHING RETURNING seq",
                event_id, stream_id, kind, at_ms, json.dumps(body, separators=(",", ":")))
            if seq is None:
                return None
            await db.executemany("INSERT INTO livesight.stream_evidence (event_id, n, at_ms, jpeg) VALUES ($1, $2, $3, $4)",
                                 [(event_id, n, at, jpeg) for n, (at, jpeg) in enumerate(evidence)])
            await db.executemany(
                "INSERT INTO livesight.stream_deliveries (event_id, channel, target, due_ms) VALUES ($1, $2, $3, $4)",
                [(event_id, channel, json.dumps(target), at_ms) for channel, target in deliveries])
            await db.execute(
                "DELETE FROM livesight.stream_events WHERE stream_id = $1 AND seq <= ("
                " SELECT seq FROM livesight.stream_events WHERE stream_id = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)",
                stream_id, self.max_events)
            await db.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, stream_id)
        self._wake()
        return StreamEvent(int(seq), event_id, stream_id, kind, at_ms, body)

    async def after(self, stream_id: str, seq: int, limit: int = 100) -> list[StreamEvent]:
        async with self.pool.acquire() as db:
            rows = await db.fetch(f"SELECT {_EVENT} FROM livesight.stream_events e WHERE e.stream_id = $1 AND e.seq > $2"
                                  " ORDER BY e.seq LIMIT $3", stream_id, seq, limit)
        return [_event(r) for r in rows]

    async def evidence(self, stream_id: str, event_id: str, n: int) -> bytes | None:
        async with self.pool.acquire() as db:
            jpeg = await db.fetchval(
                "SELECT v.jpeg FROM livesight.stream_evidence v JOIN livesight.stream_events e ON e.event_id = v.event_id"
                " WHERE e.stream_id = $1 AND v.event_id = $2 AND v.n = $3", stream_id, event_id, n)
        return None if jpeg is None else bytes(jpeg)

    # -------------------------------------------------------------- deliveries
    async def due(self, now_ms: float, limit: int, claim_ms: float) -> list[Delivery]:
        async with self.pool.acquire() as db:
            rows = await db.fetch(
                "WITH claimed AS (SELECT event_id, channel FROM livesight.stream_deliveries"
                "  WHERE state = 'pending' AND due_ms <= $1 ORDER BY due_ms LIMIT $2 FOR UPDATE SKIP LOCKED)"
                " UPDATE livesight.stream_deliveries d SET due_ms = $1 + $3"
                " FROM claimed c, livesight.stream_events e"
                " WHERE d.event_id = c.event_id AND d.channel = c.channel AND e.event_id = d.event_id"
                f" RETURNING {_EVENT}, d.channel, d.target, d.attempts", now_ms, limit, claim_ms)
        rows = sorted(rows, key=lambda r: r["seq"])
        return [Delivery(_event(r), r["channel"], json.loads(r["target"]), r["attempts"]) for r in rows]

    async def next_due_ms(self) -> float | None:
        async with self.pool.acquire() as db:
            due = await db.fetchval("SELECT MIN(due_ms) FROM livesight.stream_deliveries WHERE state = 'pending'")
        return None if due is None else float(due)

    async def settle(self, event_id: str, channel: str, state: str, due_ms: float, error: str | None = None) -> None:
        async with self.pool.acquire() as db:
            await db.execute(
                "UPDATE livesight.stream_deliveries SET state = $1, due_ms = $2, attempts = attempts + 1, last_error = $3"
                " WHERE event_id = $4 AND channel = $5", state, due_ms, error, event_id, channel)

    async def counts(self, stream_id: str) -> dict[str, int]:
        async with self.pool.acquire() as db:
            rows = await db.fetch(
                "SELECT d.state, COUNT(*) AS n FROM livesight.stream_deliveries d"
                " JOIN livesight.stream_events e ON e.event_id = d.event_id WHERE e.stream_id = $1 GROUP BY d.state",
                stream_id)
        return {r["state"]: int(r["n"]) for r in rows}

    # ----------------------------------------------------------------- streams
    async def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any], holder: str | None,
                          lease_s: float) -> int:
        async with self.pool.acquire() as db:
            return int(await db.fetchval(
                "INSERT INTO livesight.streams (stream_id, owner, settings, holder, lease_until)"
                f" VALUES ($1, $3, $4, $5, CASE WHEN $5::text IS NULL THEN '-infinity' ELSE {_LEASE} END)"
                " ON CONFLICT (stream_id) DO UPDATE SET settings = EXCLUDED.settings,"
                " revision = livesight.streams.revision + 1 RETURNING revision",
                stream_id, float(lease_s), owner, json.dumps(settings), holder))

    async def given_streams(self, streams: dict[str, dict[str, Any]]) -> None:
        async with self.pool.acquire() as db, db.transaction():
            gone = await db.fetch("SELECT stream_id FROM livesight.streams WHERE given AND NOT stream_id = ANY($1::text[])",
                                  list(streams))
            for row in gone:
                await db.execute("DELETE FROM livesight.stream_events WHERE stream_id = $1", row["stream_id"])
                await db.execute("DELETE FROM livesight.streams WHERE stream_id = $1", row["stream_id"])
            await db.executemany(
                "INSERT INTO livesight.streams (stream_id, owner, settings, given) VALUES ($1, '', $2, true)"
                " ON CONFLICT (stream_id) DO NOTHING",
                [(stream_id, json.dumps(settings)) for stream_id, settings in streams.items()])

    async def kept_streams(self) -> list[KeptStream]:
        async with self.pool.acquire() as db:
            return [_kept(r) for r in await db.fetch(_KEPT + " ORDER BY created")]

    async def hold(self, holder: str, statuses: dict[str, dict[str, Any]], room: int, lease_s: float) -> Holding:
        async with self.pool.acquire() as db, db.transaction():
            renewed = await db.fetch(
                f"UPDATE livesight.streams s SET lease_until = {_LEASE}, status = u.status"
                " FROM unnest($3::text[], $4::text[]) AS u (stream_id, status)"
                " WHERE s.stream_id = u.stream_id AND s.holder = $1 RETURNING s.stream_id, s.revision",
                holder, float(lease_s), list(statuses), [json.dumps(s) for s in statuses.values()])
            taken = await db.fetch(
                f"UPDATE livesight.streams SET holder = $1, lease_until = {_LEASE} WHERE stream_id IN ("
                "  SELECT stream_id FROM livesight.streams WHERE holder IS NULL OR lease_until <= clock_timestamp()"
                "  ORDER BY created LIMIT $3 FOR UPDATE SKIP LOCKED)"
                " RETURNING created, stream_id, owner, settings, revision, holder, true AS held, NULL AS status, given",
                holder, float(lease_s), max(room, 0))
            expiry = await db.fetchval(
                "SELECT extract(epoch FROM min(lease_until) - clock_timestamp()) FROM livesight.streams"
                " WHERE holder IS NOT NULL AND holder <> $1 AND lease_until > clock_timestamp()", holder)
        return Holding({r["stream_id"]: r["revision"] for r in renewed},
                       [_kept(r) for r in sorted(taken, key=lambda r: r["created"])],
                       None if expiry is None else max(0.0, float(expiry)))

    async def release(self, holder: str) -> None:
        async with self.pool.acquire() as db:
            await db.execute("UPDATE livesight.streams SET holder = NULL, lease_until = '-infinity' WHERE holder = $1",
                             holder)

    async def forget(self, stream_id: str) -> None:
        async with self.pool.acquire() as db, db.transaction():
            await db.execute("DELETE FROM livesight.stream_events WHERE stream_id = $1", stream_id)
            await db.execute("DELETE FROM livesight.streams WHERE stream_id = $1", stream_id)
