"""The outbox in one SQLite file (``streams.sqlite3`` in ``data_dir``), from the standard library:
one connection used by one job at a time off the event loop (as the memory store does). Leases
are timed by this machine's clock: servers sharing the file share the machine."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from server import sqlite_file
from server.streams.outbox import Delivery, Holding, KeptStream, Outbox, StreamEvent

SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    stream_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    at_ms REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS stream_events_by_stream ON stream_events (stream_id, seq);
CREATE TABLE IF NOT EXISTS stream_evidence (
    event_id TEXT NOT NULL REFERENCES stream_events (event_id) ON DELETE CASCADE,
    n INTEGER NOT NULL,
    at_ms REAL NOT NULL,
    jpeg BLOB NOT NULL,
    PRIMARY KEY (event_id, n)
);
CREATE TABLE IF NOT EXISTS stream_deliveries (
    event_id TEXT NOT NULL REFERENCES stream_events (event_id) ON DELETE CASCADE,
    channel TEXT NOT NULL,
    target TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    due_ms REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    last_error TEXT,
    PRIMARY KEY (event_id, channel)
);
CREATE INDEX IF NOT EXISTS stream_deliveries_due ON stream_deliveries (state, due_ms);
CREATE TABLE IF NOT EXISTS streams (
    stream_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    settings TEXT NOT NULL
)
"""
#: The streams' columns added after the first release (a file made before gets them on open).
LEASE_COLUMNS = {
    "revision": "INTEGER NOT NULL DEFAULT 1",
    "holder": "TEXT",
    "lease_until_ms": "REAL NOT NULL DEFAULT 0",
    "status": "TEXT",
    "given": "INTEGER NOT NULL DEFAULT 0",
}

_KEPT = "SELECT stream_id, owner, settings, revision, holder, lease_until_ms, status, given FROM streams"


def _event(row: tuple[Any, ...]) -> StreamEvent:
    return StreamEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))


def _kept(row: tuple[Any, ...], now_ms: float) -> KeptStream:
    return KeptStream(row[0], row[1], json.loads(row[2]), row[3], row[4], row[4] is not None and row[5] > now_ms,
                      json.loads(row[6]) if row[6] else None, bool(row[7]))


def _now_ms() -> float:
    return time.time() * 1000


class _Database(sqlite_file.SqliteFile):
    what = "the stream outbox"

    def __init__(self, path: Path, max_events: int) -> None:
        super().__init__(path)
        self.max_events = max_events

    def create(self, db: sqlite3.Connection) -> None:
        for statement in SCHEMA.split(";"):
            db.execute(statement)
        have = {row[1] for row in db.execute("PRAGMA table_info(streams)")}
        for column, kind in LEASE_COLUMNS.items():
            if column not in have:
                db.execute(f"ALTER TABLE streams ADD COLUMN {column} {kind}")

    # ------------------------------------------------------------------ events
    def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
            evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO stream_events (event_id, stream_id, kind, at_ms, body) VALUES (?, ?, ?, ?, ?)",
                (event_id, stream_id, kind, at_ms, json.dumps(body, separators=(",", ":"))))
            if cursor.rowcount == 0:
                return None
            seq = int(cursor.lastrowid or 0)
            db.executemany("INSERT INTO stream_evidence (event_id, n, at_ms, jpeg) VALUES (?, ?, ?, ?)",
                           [(event_id, n, at, jpeg) for n, (at, jpeg) in enumerate(evidence)])
            db.executemany("INSERT INTO stream_deliveries (event_id, channel, target, due_ms) VALUES (?, ?, ?, ?)",
                           [(event_id, channel, json.dumps(target), at_ms) for channel, target in deliveries])
            db.execute(
                "DELETE FROM stream_events WHERE stream_id = ? AND seq <= ("
                " SELECT seq FROM stream_events WHERE stream_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (stream_id, stream_id, self.max_events))
        return StreamEvent(seq, event_id, stream_id, kind, at_ms, body)

    def after(self, stream_id: str, seq: int, limit: int) -> list[StreamEvent]:
        rows = self.db.execute(
            "SELECT seq, event_id, stream_id, kind, at_ms, body FROM stream_events"
            " WHERE stream_id = ? AND seq > ? ORDER BY seq LIMIT ?", (stream_id, seq, limit)).fetchall()
        return [_event(r) for r in rows]

    def evidence(self, stream_id: str, event_id: str, n: int) -> bytes | None:
        row = self.db.execute(
            "SELECT v.jpeg FROM stream_evidence v JOIN stream_events e ON e.event_id = v.event_id"
            " WHERE e.stream_id = ? AND v.event_id = ? AND v.n = ?", (stream_id, event_id, n)).fetchone()
        return None if row is None else bytes(row[0])

    # -------------------------------------------------------------- deliveries
    def due(self, now_ms: float, limit: int, claim_ms: float) -> list[Delivery]:
        with self._transaction() as db:
            rows = db.execute(
                "SELECT e.seq, e.event_id, e.stream_id, e.kind, e.at_ms, e.body, d.channel, d.target, d.attempts"
                " FROM stream_deliveries d JOIN stream_events e ON e.event_id = d.event_id"
                " WHERE d.state = 'pending' AND d.due_ms <= ? ORDER BY d.due_ms LIMIT ?", (now_ms, limit)).fetchall()
            db.executemany("UPDATE stream_deliveries SET due_ms = ? WHERE event_id = ? AND channel = ?",
                           [(now_ms + claim_ms, r[1], r[6]) for r in rows])
        return [Delivery(_event(r[:6]), r[6], json.loads(r[7]), r[8]) for r in rows]

    def next_due_ms(self) -> float | None:
        row = self.db.execute("SELECT MIN(due_ms) FROM stream_deliveries WHERE state = 'pending'").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def settle(self, event_id: str, channel: str, state: str, due_ms: float, error: str | None) -> None:
        self.db.execute(
            "UPDATE stream_deliveries SET state = ?, due_ms = ?, attempts = attempts + 1, last_error = ?"
            " WHERE event_id = ? AND channel = ?", (state, due_ms, error, event_id, channel))

    def counts(self, stream_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT d.state, COUNT(*) FROM stream_deliveries d JOIN stream_events e ON e.event_id = d.event_id"
            " WHERE e.stream_id = ? GROUP BY d.state", (stream_id,)).fetchall()
        return {state: n for state, n in rows}

    # ----------------------------------------------------------------- streams
    def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any], holder: str | None,
                    lease_s: float) -> int:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO streams (stream_id, owner, settings, holder, lease_until_ms) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (stream_id) DO UPDATE SET settings = excluded.settings, revision = revision + 1",
                (stream_id, owner, json.dumps(settings), holder, _now_ms() + lease_s * 1000 if holder else 0))
            return int(db.execute("SELECT revision FROM streams WHERE stream_id = ?", (stream_id,)).fetchone()[0])

    def given_streams(self, streams: dict[str, dict[str, Any]]) -> None:
        with self._transaction() as db:
            old = {r[0] for r in db.execute("SELECT stream_id FROM streams WHERE given = 1")}
            for stream_id in old - streams.keys():
                db.execute("DELETE FROM stream_events WHERE stream_id = ?", (stream_id,))
                db.execute("DELETE FROM streams WHERE stream_id = ?", (stream_id,))
            db.executemany("INSERT OR IGNORE INTO streams (stream_id, owner, settings, given) VALUES (?, '', ?, 1)",
                           [(stream_id, json.dumps(settings)) for stream_id, settings in streams.items()])

    def kept_streams(self) -> list[KeptStream]:
        now_ms = _now_ms()
        return [_kept(r, now_ms) for r in self.db.execute(_KEPT + " ORDER BY rowid").fetchall()]

    def hold(self, holder: str, statuses: dict[str, dict[str, Any]], room: int, lease_s: float) -> Holding:
        now_ms = _now_ms()
        until_ms = now_ms + lease_s * 1000
        with self._transaction() as db:
            revisions: dict[str, int] = {}
            for stream_id, status in statuses.items():
                row = db.execute(
                    "UPDATE streams SET lease_until_ms = ?, status = ? WHERE stream_id = ? AND holder = ?"
                    " RETURNING revision", (until_ms, json.dumps(status), stream_id, holder)).fetchone()
                if row is not None:
                    revisions[stream_id] = int(row[0])
            rows = db.execute(
                _KEPT + " WHERE holder IS NULL OR lease_until_ms <= ? ORDER BY rowid LIMIT ?",
                (now_ms, max(room, 0))).fetchall()
            db.executemany("UPDATE streams SET holder = ?, lease_until_ms = ? WHERE stream_id = ?",
                           [(holder, until_ms, r[0]) for r in rows])
            expiry_ms = db.execute(
                "SELECT min(lease_until_ms) FROM streams WHERE holder IS NOT NULL AND holder <> ? AND lease_until_ms > ?",
                (holder, now_ms)).fetchone()[0]
        taken = [KeptStream(r[0], r[1], json.loads(r[2]), r[3], holder, True, None, bool(r[7])) for r in rows]
        return Holding(revisions, taken, None if expiry_ms is None else (expiry_ms - now_ms) / 1000)

    def release(self, holder: str) -> None:
        self.db.execute("UPDATE streams SET holder = NULL, lease_until_ms = 0 WHERE holder = ?", (holder,))

    def forget(self, stream_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM stream_events WHERE stream_id = ?", (stream_id,))
            db.execute("DELETE FROM streams WHERE stream_id = ?", (stream_id,))


class SqliteOutbox(sqlite_file.OneJobAtATime, Outbox):
    """The outbox in SQLite (see the module), each call one job off the loop."""

    what = "the stream outbox"
    backend = "sqlite"

    def __init__(self, path: Path, max_events: int) -> None:
        Outbox.__init__(self)
        self.path = path
        self._database = _Database(path, max_events)

    async def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
                  evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        kept = await self._run(self._database.add, event_id, stream_id, kind, at_ms, body, evidence, deliveries)
        if kept is not None:
            self._wake()
        return kept

    async def after(self, stream_id: str, seq: int, limit: int = 100) -> list[StreamEvent]:
        return await self._run(self._database.after, stream_id, seq, limit)

    async def evidence(self, stream_id: str, event_id: str, n: int) -> bytes | None:
        return await self._run(self._database.evidence, stream_id, event_id, n)

    async def due(self, now_ms: float, limit: int, claim_ms: float) -> list[Delivery]:
        return await self._run(self._database.due, now_ms, limit, claim_ms)

    async def next_due_ms(self) -> float | None:
        return await self._run(self._database.next_due_ms)

    async def settle(self, event_id: str, channel: str, state: str, due_ms: float, error: str | None = None) -> None:
        await self._run(self._database.settle, event_id, channel, state, due_ms, error)

    async def counts(self, stream_id: str) -> dict[str, int]:
        return await self._run(self._database.counts, stream_id)

    async def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any], holder: str | None,
                          lease_s: float) -> int:
        return await self._run(self._database.keep_stream, stream_id, owner, settings, holder, lease_s)

    async def given_streams(self, streams: dict[str, dict[str, Any]]) -> None:
        await self._run(self._database.given_streams, streams)

    async def kept_streams(self) -> list[KeptStream]:
        return await self._run(self._database.kept_streams)

    async def hold(self, holder: str, statuses: dict[str, dict[str, Any]], room: int, lease_s: float) -> Holding:
        return await self._run(self._database.hold, holder, statuses, room, lease_s)

    async def release(self, holder: str) -> None:
        await self._run(self._database.release, holder)

    async def forget(self, stream_id: str) -> None:
        await self._run(self._database.forget, stream_id)
