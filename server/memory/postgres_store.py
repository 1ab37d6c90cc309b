"""The session memory in PostgreSQL (schema ``livesight``), through a small asyncpg pool.

JPEGs are ``bytea`` stored uncompressed (``STORAGE EXTERNAL``: JPEG does not compress). Text search
is ``to_tsvector('simple', ...)`` under GIN indexes, queried with ``plainto_tsquery`` so a user's
text is only ever words. A trigger keeps each session's byte count in ``sessions``.

Locks, always taken in this order so that no two transactions wait on each other: the store-wide
advisory lock (schema creation, eviction across sessions), then one session's row in ``sessions``
(every write to a session, each session's part of a sweep), then that session's rows. A write takes
its session's row first, so the moments of one session are chained one at a time; eviction across
sessions runs in transactions of its own after the write commits.

Resume handles are a table of their own, with no foreign key (a session's row goes with its last
moment and note; its handles stay until used, cleared or swept). Keeping a handle, and a clear's
deletion of handles (after its session row), hold an advisory lock of the handle's session, so
racing keeps leave at most ``MAX_HANDLES_PER_SESSION``; a take is one single-row DELETE that decides
who gets the session, and a sweep skips handle rows others hold, so none of them waits in a cycle.

What PostgreSQL cannot promise: a cleared session's rows stay in the table files as dead tuples
until VACUUM reuses their space, and in the write-ahead log until it is recycled.
"""

from __future__ import annotations

import math

import asyncpg

from server.memory.store import (
    MAX_HANDLES_PER_SESSION,
    MemoryLimits,
    MemoryStore,
    Moment,
    Note,
    TextHit,
    checked_handle,
    checked_kind,
    checked_session,
    clamped,
    same_owner,
    search_words,
    spread_instants,
    stored_text,
    text_bytes,
)
from server.postgres_pool import open_pool

#: The advisory lock key of the schema's creation and of store-wide deletions.
_STORE_LOCK = 0x6C69766573696768  # "livesigh"
#: The first key of a session's handle lock (the second is its id's hash): a key space apart from _STORE_LOCK.
_HANDLES_LOCK = 0x68616E64  # "hand"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS livesight;
CREATE TABLE IF NOT EXISTS livesight.sessions (
    session_id text PRIMARY KEY,
    bytes bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS livesight.moments (
    moment_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text NOT NULL REFERENCES livesight.sessions (session_id) ON DELETE CASCADE,
    start_ms double precision NOT NULL,
    end_ms double precision,
    jpeg_bytes integer NOT NULL,
    caption text,
    bytes bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS moments_by_session ON livesight.moments (session_id, start_ms, moment_id);
CREATE INDEX IF NOT EXISTS moments_by_age ON livesight.moments (start_ms, moment_id);
CREATE INDEX IF NOT EXISTS moments_words ON livesight.moments
    USING gin (to_tsvector('simple', caption)) WHERE caption IS NOT NULL;
CREATE TABLE IF NOT EXISTS livesight.jpegs (
    moment_id bigint PRIMARY KEY REFERENCES livesight.moments (moment_id) ON DELETE CASCADE,
    data bytea NOT NULL
);
ALTER TABLE livesight.jpegs ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE IF NOT EXISTS livesight.notes (
    note_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id text NOT NULL REFERENCES livesight.sessions (session_id) ON DELETE CASCADE,
    kind text NOT NULL,
    at_ms double precision NOT NULL,
    text text NOT NULL,
    moment_id bigint REFERENCES livesight.moments (moment_id) ON DELETE SET NULL,
    bytes bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_session ON livesight.notes (session_id, at_ms, note_id);
CREATE INDEX IF NOT EXISTS notes_by_moment ON livesight.notes (moment_id);
CREATE INDEX IF NOT EXISTS notes_by_age ON livesight.notes (at_ms, note_id);
CREATE INDEX IF NOT EXISTS notes_words ON livesight.notes USING gin (to_tsvector('simple', text));
CREATE TABLE IF NOT EXISTS livesight.handles (
    kept bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handle text NOT NULL UNIQUE,
    session_id text NOT NULL,
    owner text NOT NULL,
    at_ms double precision NOT NULL
);
CREATE INDEX IF NOT EXISTS handles_by_session ON livesight.handles (session_id, at_ms, kept);
CREATE INDEX IF NOT EXISTS handles_by_age ON livesight.handles (at_ms);
CREATE TABLE IF NOT EXISTS livesight.owners (
    session_id text PRIMARY KEY,
    owner text NOT NULL,
    at_ms double precision NOT NULL
);

CREATE OR REPLACE FUNCTION livesight.count_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE livesight.sessions SET bytes = bytes + NEW.bytes WHERE session_id = NEW.session_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE livesight.sessions SET bytes = bytes - OLD.bytes WHERE session_id = OLD.session_id;
    ELSIF NEW.bytes <> OLD.bytes THEN
        UPDATE livesight.sessions SET bytes = bytes + NEW.bytes - OLD.bytes WHERE session_id = NEW.session_id;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS moments_bytes ON livesight.moments;
CREATE TRIGGER moments_bytes AFTER INSERT OR DELETE OR UPDATE OF bytes ON livesight.moments
    FOR EACH ROW EXECUTE FUNCTION livesight.count_bytes();
DROP TRIGGER IF EXISTS notes_bytes ON livesight.notes;
CREATE TRIGGER notes_bytes AFTER INSERT OR DELETE OR UPDATE OF bytes ON livesight.notes
    FOR EACH ROW EXECUTE FUNCTION livesight.count_bytes();
"""

_MOMENT_COLUMNS = "m.moment_id, m.session_id, m.start_ms, m.end_ms, m.jpeg_bytes, m.caption"
_NOTE_COLUMNS = "note_id, session_id, kind, at_ms, text, moment_id"
#: The start of the moment of session $1 current at $2 (or $2 when none is): a range's first moment.
_RANGE_START = "COALESCE((SELECT max(start_ms) FROM livesight.moments WHERE session_id = $1 AND start_ms <= $2), $2)"
#: The session's moment current at $2 (the newest started by then).
_CURRENT = (
    "SELECT moment_id FROM livesight.moments WHERE session_id = $1 AND start_ms <= $2"
    " ORDER BY start_ms DESC, moment_id DESC LIMIT 1"
)


def _moment(row: asyncpg.Record) -> Moment:
    end_ms = row["end_ms"]
    return Moment(row["moment_id"], row["session_id"], row["start_ms"], row["start_ms"] if end_ms is None else end_ms,
                  row["jpeg_bytes"], row["caption"])


def _bounds(from_ms: float | None, to_ms: float | None) -> tuple[float, float]:
    return (-math.inf if from_ms is None else float(from_ms)), (math.inf if to_ms is None else float(to_ms))


def _count(status: str) -> int:
    """The rows a command touched, from its status (``DELETE 3``)."""
    return int(status.rsplit(" ", 1)[-1])


async def _lock_session(db: asyncpg.Connection, session_id: str) -> None:
    """Make the session's row if missing and hold it until the transaction ends."""
    # One statement: an upsert inserts or locks even while a clear deletes the row.
    await db.execute(
        "INSERT INTO livesight.sessions (session_id) VALUES ($1)"
        " ON CONFLICT (session_id) DO UPDATE SET bytes = livesight.sessions.bytes", session_id)


async def _lock_handles(db: asyncpg.Connection, session_id: str) -> None:
    """Hold the lock of the session's handles until the transaction ends."""
    await db.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _HANDLES_LOCK, session_id)


async def _usage(db: asyncpg.Connection, session_id: str | None) -> int:
    if session_id is None:
        return await db.fetchval("SELECT COALESCE(sum(bytes), 0)::bigint FROM livesight.sessions")
    return await db.fetchval("SELECT bytes FROM livesight.sessions WHERE session_id = $1", session_id) or 0


async def _create(db: asyncpg.Connection) -> None:
    """The schema, where its newest table is missing (a database made before it gets the rest
    again, each part idempotent)."""
    if await db.fetchval("SELECT to_regclass('livesight.owners')") is None:
        await db.execute(SCHEMA)


class PostgresMemoryStore(MemoryStore):
    """The session memory in the PostgreSQL database at ``url``."""

    backend = "postgresql"

    def __init__(self, url: str, limits: MemoryLimits, max_connections: int = 4) -> None:
        self.url = url
        self.limits = limits
        self.max_connections = max_connections
        self._pool: asyncpg.Pool | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool; raises RuntimeError before ``open`` or after ``close``."""
        if self._pool is None:
            raise RuntimeError("the PostgreSQL memory store is not open")
        return self._pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        self._pool = await open_pool(self.url, self.max_connections, _STORE_LOCK, _create)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # ----------------------------------------------------------------------------------- writing
    async def add_moment(self, session_id: str, at_ms: float, jpeg: bytes) -> Moment:
        session_id, at_ms, jpeg = checked_session(session_id), float(at_ms), bytes(jpeg)
        async with self.pool.acquire() as db:
            async with db.transaction():
                await _lock_session(db, session_id)
                previous = await db.fetchval(_CURRENT, session_id, at_ms)
                following = await db.fetchval(
                    "SELECT min(start_ms) FROM livesight.moments WHERE session_id = $1 AND start_ms > $2",
                    session_id, at_ms)
                if previous is not None:
                    await db.execute("UPDATE livesight.moments SET end_ms = $2 WHERE moment_id = $1", previous, at_ms)
                moment_id = await db.fetchval(
                    "INSERT INTO livesight.moments (session_id, start_ms, end_ms, jpeg_bytes, bytes)"
                    " VALUES ($1, $2, $3, $4, $5) RETURNING moment_id",
                    session_id, at_ms, following, len(jpeg), len(jpeg))
                await db.execute("INSERT INTO livesight.jpegs (moment_id, data) VALUES ($1, $2)", moment_id, jpeg)
                await db.execute(
                    "UPDATE livesight.notes SET moment_id = $2 WHERE session_id = $1 AND at_ms >= $3 AND at_ms < $4",
                    session_id, moment_id, at_ms, math.inf if following is None else following)
                await self._delete_past_limit(db, session_id, moment_id, None)
            await self._delete_past_store_limit(db, moment_id, None)
        return Moment(moment_id, session_id, at_ms, at_ms if following is None else following, len(jpeg), None)

    async def set_caption(self, session_id: str, moment_id: int, caption: str) -> None:
        session_id, caption = checked_session(session_id), stored_text(caption)
        async with self.pool.acquire() as db:
            async with db.transaction():
                await _lock_session(db, session_id)
                changed = await db.fetchval(
                    "UPDATE livesight.moments SET caption = $3, bytes = jpeg_bytes + $4"
                    " WHERE session_id = $1 AND moment_id = $2 RETURNING true",
                    session_id, moment_id, caption, text_bytes(caption))
                if changed:
                    await self._delete_past_limit(db, session_id, moment_id, None)
            if changed:
                await self._delete_past_store_limit(db, moment_id, None)

    async def add_note(self, session_id: str, kind: str, at_ms: float, text: str) -> Note:
        session_id, note_kind, at_ms = checked_session(session_id), checked_kind(kind), float(at_ms)
        text = stored_text(text)
        async with self.pool.acquire() as db:
            async with db.transaction():
                await _lock_session(db, session_id)
                moment_id = await db.fetchval(_CURRENT, session_id, at_ms)
                note_id = await db.fetchval(
                    "INSERT INTO livesight.notes (session_id, kind, at_ms, text, moment_id, bytes)"
                    " VALUES ($1, $2, $3, $4, $5, $6) RETURNING note_id",
                    session_id, note_kind, at_ms, text, moment_id, text_bytes(text))
                await self._delete_past_limit(db, session_id, moment_id, note_id)
            await self._delete_past_store_limit(db, moment_id, note_id)
        return Note(note_id, session_id, note_kind, at_ms, text, moment_id)

    async def clear(self, session_id: str) -> int:
        async with self.pool.acquire() as db, db.transaction():
            await db.execute("SELECT 1 FROM livesight.sessions WHERE session_id = $1 FOR UPDATE", session_id)
            deleted = _count(await db.execute("DELETE FROM livesight.notes WHERE session_id = $1", session_id))
            deleted += _count(await db.execute("DELETE FROM livesight.moments WHERE session_id = $1", session_id))
            await db.execute("DELETE FROM livesight.sessions WHERE session_id = $1", session_id)
            await _lock_handles(db, session_id)
            await db.execute("DELETE FROM livesight.handles WHERE session_id = $1", session_id)
            await db.execute("DELETE FROM livesight.owners WHERE session_id = $1", session_id)
        return deleted

    async def sweep(self, now_ms: float) -> int:
        cutoff = float(now_ms) - self.limits.max_age_s * 1000
        deleted = 0
        async with self.pool.acquire() as db:
            sessions = await db.fetch(
                "SELECT session_id FROM livesight.notes WHERE at_ms < $1 UNION"
                " SELECT session_id FROM livesight.moments WHERE start_ms < $1 AND COALESCE(end_ms, start_ms) < $1",
                cutoff)
            for (session_id,) in sessions:
                async with db.transaction():
                    await db.execute("SELECT 1 FROM livesight.sessions WHERE session_id = $1 FOR UPDATE", session_id)
                    deleted += _count(await db.execute(
                        "DELETE FROM livesight.notes WHERE session_id = $1 AND at_ms < $2", session_id, cutoff))
                    deleted += _count(await db.execute(
                        "DELETE FROM livesight.moments WHERE session_id = $1 AND start_ms < $2"
                        " AND COALESCE(end_ms, start_ms) < $2", session_id, cutoff))
                    await db.execute(
                        "DELETE FROM livesight.sessions WHERE session_id = $1"
                        " AND NOT EXISTS (SELECT 1 FROM livesight.moments WHERE session_id = $1)"
                        " AND NOT EXISTS (SELECT 1 FROM livesight.notes WHERE session_id = $1)", session_id)
            await db.execute(
                "DELETE FROM livesight.handles WHERE kept IN (SELECT kept FROM livesight.handles WHERE at_ms < $1"
                " FOR UPDATE SKIP LOCKED)", cutoff)
            await db.execute(
                "DELETE FROM livesight.owners WHERE at_ms < $1"
                " AND NOT EXISTS (SELECT 1 FROM livesight.sessions s WHERE s.session_id = livesight.owners.session_id)",
                cutoff)
        return deleted

    async def claim(self, session_id: str, owner: str, at_ms: float) -> None:
        _, owner = checked_handle("-", owner)
        async with self.pool.acquire() as db:
            await db.execute("INSERT INTO livesight.owners (session_id, owner, at_ms) VALUES ($1, $2, $3)"
                             " ON CONFLICT (session_id) DO NOTHING", checked_session(session_id), owner, float(at_ms))

    async def owner(self, session_id: str) -> str | None:
        async with self.pool.acquire() as db:
            return await db.fetchval("SELECT owner FROM livesight.owners WHERE session_id = $1",
                                     checked_session(session_id))

    async def keep_handle(self, handle: str, session_id: str, owner: str, at_ms: float) -> None:
        handle, owner = checked_handle(handle, owner)
        session_id, at_ms = checked_session(session_id), float(at_ms)
        async with self.pool.acquire() as db, db.transaction():
            await _lock_handles(db, session_id)
            # A new ``kept`` on replacing too: a take that read the old row then deletes nothing.
            await db.execute(
                "INSERT INTO livesight.handles (handle, session_id, owner, at_ms) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (handle) DO UPDATE SET kept = DEFAULT, session_id = EXCLUDED.session_id,"
                " owner = EXCLUDED.owner, at_ms = EXCLUDED.at_ms", handle, session_id, owner, at_ms)
            await db.execute(
                "DELETE FROM livesight.handles WHERE session_id = $1 AND kept NOT IN (SELECT kept FROM"
                " livesight.handles WHERE session_id = $1 ORDER BY at_ms DESC, kept DESC LIMIT $2)",
                session_id, MAX_HANDLES_PER_SESSION)

    async def take_handle(self, handle: str, owner: str) -> str | None:
        try:
            handle, owner = checked_handle(handle, owner)
        except ValueError:  # no store could have kept it
            return None
        async with self.pool.acquire() as db:
            row = await db.fetchrow("SELECT kept, session_id, owner FROM livesight.handles WHERE handle = $1", handle)
            if row is None or not same_owner(row["owner"], owner):
                return None
            # The DELETE decides: of concurrent takers, only the one whose DELETE removed the row gets it.
            return await db.fetchval(
                "DELETE FROM livesight.handles WHERE kept = $1 RETURNING session_id", row["kept"])

    async def _delete_past_limit(
        self, db: asyncpg.Connection, session_id: str, keep_moment: int | None, keep_note: int | None
    ) -> None:
        """Inside the session's transaction: delete its oldest moments (each with its notes) while it
        is over its limit; never ``keep_moment`` nor ``keep_note``."""
        while await _usage(db, session_id) > self.limits.max_session_bytes:
            if not await self._delete_oldest(db, session_id, keep_moment, keep_note):
                return

    async def _delete_past_store_limit(
        self, db: asyncpg.Connection, keep_moment: int | None, keep_note: int | None
    ) -> None:
        """After a write: while the store is over its limit, delete the oldest moment of any session
        (one transaction each, under the store-wide lock, then the victim's session row)."""
        while await _usage(db, None) > self.limits.max_bytes:
            async with db.transaction():
                await db.execute("SELECT pg_advisory_xact_lock($1)", _STORE_LOCK)
                victim = await db.fetchval(
                    "SELECT COALESCE((SELECT session_id FROM livesight.moments WHERE moment_id IS DISTINCT FROM $1"
                    " ORDER BY start_ms, moment_id LIMIT 1), (SELECT session_id FROM livesight.notes"
                    " WHERE note_id IS DISTINCT FROM $2 ORDER BY at_ms, note_id LIMIT 1))", keep_moment, keep_note)
                if victim is None:
                    return
                await db.execute("SELECT 1 FROM livesight.sessions WHERE session_id = $1 FOR UPDATE", victim)
                if not await self._delete_oldest(db, victim, keep_moment, keep_note):
                    return

    async def _delete_oldest(
        self, db: asyncpg.Connection, session_id: str, keep_moment: int | None, keep_note: int | None
    ) -> bool:
        """Delete the session's oldest moment with its notes and the notes before it, or else its
        oldest note. Returns whether anything was deleted."""
        oldest = await db.fetchrow(
            "SELECT moment_id, end_ms FROM livesight.moments WHERE session_id = $1 AND moment_id IS DISTINCT FROM $2"
            " ORDER BY start_ms, moment_id LIMIT 1", session_id, keep_moment)
        if oldest is not None:
            end_ms = math.inf if oldest["end_ms"] is None else oldest["end_ms"]
            await db.execute(
                "DELETE FROM livesight.notes WHERE session_id = $1 AND note_id IS DISTINCT FROM $2"
                " AND (moment_id = $3 OR (moment_id IS NULL AND at_ms < $4))",
                session_id, keep_note, oldest["moment_id"], end_ms)
            await db.execute("DELETE FROM livesight.moments WHERE moment_id = $1", oldest["moment_id"])
            return True
        return _count(await db.execute(
            "DELETE FROM livesight.notes WHERE note_id = (SELECT note_id FROM livesight.notes"
            " WHERE session_id = $1 AND note_id IS DISTINCT FROM $2 ORDER BY at_ms, note_id LIMIT 1)",
            session_id, keep_note)) > 0

    # ----------------------------------------------------------------------------------- reading
    async def moments(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Moment]:
        low, high = _bounds(from_ms, to_ms)
        rows = await self.pool.fetch(
            f"SELECT {_MOMENT_COLUMNS} FROM livesight.moments m WHERE session_id = $1 AND start_ms >= {_RANGE_START}"
            " AND start_ms <= $3 ORDER BY start_ms, moment_id LIMIT $4", session_id, low, high, clamped(limit))
        return [_moment(row) for row in rows]

    async def spread(self, session_id: str, from_ms: float, to_ms: float, n: int) -> list[tuple[Moment, bytes]]:
        instants = spread_instants(float(from_ms), float(to_ms), n)
        if not instants:
            return []
        # Each instant's current moment, or the range's first one for an instant before the session's first.
        picks = await self.pool.fetch(
            "SELECT COALESCE("
            " (SELECT moment_id FROM livesight.moments WHERE session_id = $1 AND start_ms <= t"
            "  ORDER BY start_ms DESC, moment_id DESC LIMIT 1),"
            " (SELECT moment_id FROM livesight.moments WHERE session_id = $1 AND start_ms > t AND start_ms <= $3"
            "  ORDER BY start_ms, moment_id LIMIT 1)) AS moment_id"
            " FROM unnest($2::float8[]) AS t", session_id, instants, float(to_ms))
        ids = sorted({row["moment_id"] for row in picks if row["moment_id"] is not None})
        rows = await self.pool.fetch(
            f"SELECT {_MOMENT_COLUMNS}, j.data FROM livesight.moments m JOIN livesight.jpegs j USING (moment_id)"
            " WHERE m.moment_id = ANY($1::bigint[]) ORDER BY m.start_ms, m.moment_id", ids)
        return [(_moment(row), row["data"]) for row in rows]

    async def jpeg(self, session_id: str, moment_id: int) -> bytes | None:
        return await self.pool.fetchval(
            "SELECT j.data FROM livesight.jpegs j JOIN livesight.moments m USING (moment_id)"
            " WHERE m.moment_id = $2 AND m.session_id = $1", session_id, moment_id)

    async def search_text(
        self, session_id: str, text: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 20
    ) -> list[TextHit]:
        words = search_words(text)
        if not words or clamped(limit) == 0:
            return []
        low, high = _bounds(from_ms, to_ms)
        rows = await self.pool.fetch(
            "WITH query AS (SELECT plainto_tsquery('simple', $4) AS q), hits AS ("
            " SELECT n.at_ms, n.kind, n.text, n.moment_id FROM livesight.notes n, query"
            " WHERE n.session_id = $1 AND n.at_ms BETWEEN $2 AND $3 AND to_tsvector('simple', n.text) @@ query.q"
            " UNION ALL"
            " SELECT m.start_ms, 'caption', m.caption, m.moment_id FROM livesight.moments m, query"
            f" WHERE m.session_id = $1 AND m.start_ms >= {_RANGE_START} AND m.start_ms <= $3"
            " AND m.caption IS NOT NULL AND to_tsvector('simple', m.caption) @@ query.q)"
            " SELECT at_ms, kind, text, moment_id FROM hits ORDER BY at_ms DESC LIMIT $5",
            session_id, low, high, " ".join(words), clamped(limit))
        ids = sorted({row["moment_id"] for row in rows if row["moment_id"] is not None})
        found = {
            row["moment_id"]: _moment(row)
            for row in await self.pool.fetch(
                f"SELECT {_MOMENT_COLUMNS} FROM livesight.moments m WHERE moment_id = ANY($1::bigint[])", ids)
        }
        return [TextHit(row["at_ms"], row["kind"], row["text"], found.get(row["moment_id"])) for row in rows]

    async def notes(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Note]:
        low, high = _bounds(from_ms, to_ms)
        rows = await self.pool.fetch(
            f"SELECT {_NOTE_COLUMNS} FROM livesight.notes WHERE session_id = $1 AND at_ms BETWEEN $2 AND $3"
            " ORDER BY at_ms, note_id LIMIT $4", session_id, low, high, clamped(limit))
        return [Note(*row) for row in rows]

    async def usage(self, session_id: str | None = None) -> int:
        async with self.pool.acquire() as db:
            return await _usage(db, session_id)

    async def has(self, session_id: str) -> bool:
        return await self.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM livesight.moments WHERE session_id = $1)"
            " OR EXISTS (SELECT 1 FROM livesight.notes WHERE session_id = $1)", session_id)
