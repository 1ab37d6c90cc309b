"""What the streams deliver, kept in SQLite until it is delivered: every event of a stream
(a watch fired, a fired watch's narration) with its evidence frames, and one delivery per
event and channel (webhook, MQTT) that stays due until its receiver took it.

One file (``streams.sqlite3`` in ``data_dir``), one connection used by one job at a time off
the event loop (as the memory store does). An event's ``seq`` orders a stream's events (the
Server-Sent Events' ids); its ``event_id`` is the receivers' idempotency key. Bounded: a
stream keeps its newest ``max_events`` events (the rest go with their evidence and
deliveries); a delivery still failing ``max_age_s`` after its event is given up. The streams
created through the API are kept too (their settings and owner), so a restart pulls them again.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from server import sqlite_file

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
);
"""


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


def _event(row: tuple[Any, ...]) -> StreamEvent:
    return StreamEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))


class _Database(sqlite_file.SqliteFile):
    what = "the stream outbox"

    def __init__(self, path: Path, max_events: int) -> None:
        super().__init__(path)
        self.max_events = max_events

    def create(self, db: sqlite3.Connection) -> None:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)

    def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
            evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        """Keep an event with its evidence and deliveries (None: ``event_id`` was kept before)."""
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

    def due(self, now_ms: float, limit: int) -> list[Delivery]:
        rows = self.db.execute(
            "SELECT e.seq, e.event_id, e.stream_id, e.kind, e.at_ms, e.body, d.channel, d.target, d.attempts"
            " FROM stream_deliveries d JOIN stream_events e ON e.event_id = d.event_id"
            " WHERE d.state = 'pending' AND d.due_ms <= ? ORDER BY d.due_ms LIMIT ?", (now_ms, limit)).fetchall()
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

    def forget(self, stream_id: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM stream_events WHERE stream_id = ?", (stream_id,))
            db.execute("DELETE FROM streams WHERE stream_id = ?", (stream_id,))

    def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO streams (stream_id, owner, settings) VALUES (?, ?, ?)",
                        (stream_id, owner, json.dumps(settings)))

    def kept_streams(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self.db.execute("SELECT stream_id, owner, settings FROM streams ORDER BY rowid").fetchall()
        return [(r[0], r[1], json.loads(r[2])) for r in rows]


class Outbox(sqlite_file.OneJobAtATime):
    """The streams' events and deliveries (see the module), each call one job off the loop."""

    what = "the stream outbox"

    def __init__(self, path: Path, max_events: int) -> None:
        self.path = path
        self._database = _Database(path, max_events)
        self.added = anyio.Event()  # set when an event is kept (the senders and SSE readers wait on it)


    async def add(self, event_id: str, stream_id: str, kind: str, at_ms: float, body: dict[str, Any],
                  evidence: list[tuple[float, bytes]], deliveries: list[tuple[str, dict[str, Any]]]) -> StreamEvent | None:
        kept = await self._run(self._database.add, event_id, stream_id, kind, at_ms, body, evidence, deliveries)
        if kept is not None:
            self.added.set()
            self.added = anyio.Event()
        return kept

    async def after(self, stream_id: str, seq: int, limit: int = 100) -> list[StreamEvent]:
        return await self._run(self._database.after, stream_id, seq, limit)

    async def evidence(self, stream_id: str, event_id: str, n: int) -> bytes | None:
        return await self._run(self._database.evidence, stream_id, event_id, n)

    async def due(self, now_ms: float, limit: int) -> list[Delivery]:
        return await self._run(self._database.due, now_ms, limit)

    async def next_due_ms(self) -> float | None:
        return await self._run(self._database.next_due_ms)

    async def settle(self, event_id: str, channel: str, state: str, due_ms: float, error: str | None = None) -> None:
        await self._run(self._database.settle, event_id, channel, state, due_ms, error)

    async def counts(self, stream_id: str) -> dict[str, int]:
        return await self._run(self._database.counts, stream_id)

    async def keep_stream(self, stream_id: str, owner: str, settings: dict[str, Any]) -> None:
        """Keep a stream created through the API, to pull again after a restart."""
        await self._run(self._database.keep_stream, stream_id, owner, settings)

    async def kept_streams(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The streams kept: (id, owner, settings), in the order they were created."""
        return await self._run(self._database.kept_streams)

    async def forget(self, stream_id: str) -> None:
        """A stream deleted: its events, evidence, deliveries and itself."""
        await self._run(self._database.forget, stream_id)
