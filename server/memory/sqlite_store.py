"""The session memory in one SQLite file (JPEGs as BLOBs beside the rows), from the standard library.

One connection, used by one job at a time through a limiter of one slot (``server.blocking``), so
every statement runs off the event loop and calls never interleave. WAL (``server/sqlite_file.py``)
with ``synchronous=NORMAL`` (a commit does not wait for the disk; a power cut may lose the last
ones, never corrupt the file), ``secure_delete`` (freed pages are zeroed) and, after ``clear``, a
checkpoint that truncates the WAL, so a cleared session's bytes are gone from both files. Resume handles are a table of their own,
with no foreign key: a session's row goes with its last moment and note, its handles stay until used, cleared or
swept. Text search is FTS5 over notes and captions (two
external-content indexes kept in step by triggers); triggers also keep each session's byte count.
A sweep zeroes the pages it frees too, but leaves the WAL and the FTS5 index to their own automatic
checkpoints and merges.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from server import sqlite_file
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

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS moments (
    moment_id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    start_ms REAL NOT NULL,
    end_ms REAL,
    jpeg_bytes INTEGER NOT NULL,
    caption TEXT,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS moments_by_session ON moments (session_id, start_ms);
CREATE INDEX IF NOT EXISTS moments_by_age ON moments (start_ms);
CREATE TABLE IF NOT EXISTS jpegs (
    moment_id INTEGER PRIMARY KEY REFERENCES moments (moment_id) ON DELETE CASCADE,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS notes (
    note_id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    at_ms REAL NOT NULL,
    text TEXT NOT NULL,
    moment_id INTEGER REFERENCES moments (moment_id) ON DELETE SET NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_session ON notes (session_id, at_ms);
CREATE INDEX IF NOT EXISTS notes_by_moment ON notes (moment_id);
CREATE INDEX IF NOT EXISTS notes_by_age ON notes (at_ms);
CREATE TABLE IF NOT EXISTS handles (
    kept INTEGER PRIMARY KEY,
    handle TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    at_ms REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS handles_by_session ON handles (session_id, at_ms);
CREATE INDEX IF NOT EXISTS handles_by_age ON handles (at_ms);
CREATE TABLE IF NOT EXISTS owners (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    at_ms REAL NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS notes_fts USING fts5 (text, content='notes', content_rowid='note_id');
CREATE VIRTUAL TABLE IF NOT EXISTS captions_fts USING fts5 (caption, content='moments', content_rowid='moment_id');

CREATE TRIGGER IF NOT EXISTS notes_added AFTER INSERT ON notes BEGIN
    INSERT INTO notes_fts (rowid, text) VALUES (new.note_id, new.text);
    UPDATE sessions SET bytes = bytes + new.bytes WHERE session_id = new.session_id;
END;
CREATE TRIGGER IF NOT EXISTS notes_deleted AFTER DELETE ON notes BEGIN
    INSERT INTO notes_fts (notes_fts, rowid, text) VALUES ('delete', old.note_id, old.text);
    UPDATE sessions SET bytes = bytes - old.bytes WHERE session_id = old.session_id;
END;
CREATE TRIGGER IF NOT EXISTS moments_added AFTER INSERT ON moments BEGIN
    INSERT INTO captions_fts (rowid, caption) SELECT new.moment_id, new.caption WHERE new.caption IS NOT NULL;
    UPDATE sessions SET bytes = bytes + new.bytes WHERE session_id = new.session_id;
END;
CREATE TRIGGER IF NOT EXISTS moments_deleted AFTER DELETE ON moments BEGIN
    INSERT INTO captions_fts (captions_fts, rowid, caption)
        SELECT 'delete', old.moment_id, old.caption WHERE old.caption IS NOT NULL;
    UPDATE sessions SET bytes = bytes - old.bytes WHERE session_id = old.session_id;
END;
CREATE TRIGGER IF NOT EXISTS moments_captioned AFTER UPDATE OF caption ON moments BEGIN
    INSERT INTO captions_fts (captions_fts, rowid, caption)
        SELECT 'delete', old.moment_id, old.caption WHERE old.caption IS NOT NULL;
    INSERT INTO captions_fts (rowid, caption) SELECT new.moment_id, new.caption WHERE new.caption IS NOT NULL;
    UPDATE sessions SET bytes = bytes + new.bytes - old.bytes WHERE session_id = new.session_id;
END;
"""

_MOMENT_COLUMNS = "moment_id, session_id, start_ms, end_ms, jpeg_bytes, caption"
_NOTE_COLUMNS = "note_id, session_id, kind, at_ms, text, moment_id"
#: The start of the moment current at :from_ms (or :from_ms when none is): a range's first moment.
_RANGE_START = (
    "COALESCE((SELECT MAX(start_ms) FROM moments WHERE session_id = :sid AND start_ms <= :from_ms), :from_ms)"
)


def _moment(row: tuple) -> Moment:
    moment_id, session_id, start_ms, end_ms, jpeg_bytes, caption = row
    return Moment(moment_id, session_id, start_ms, start_ms if end_ms is None else end_ms, jpeg_bytes, caption)


def _note(row: tuple) -> Note:
    note_id, session_id, kind, at_ms, text, moment_id = row
    return Note(note_id, session_id, kind, at_ms, text, moment_id)


def _bounds(from_ms: float | None, to_ms: float | None) -> tuple[float, float]:
    return (-math.inf if from_ms is None else float(from_ms)), (math.inf if to_ms is None else float(to_ms))


class SqliteDatabase(sqlite_file.SqliteFile):
    """The SQLite file and its one connection. Not thread-safe: one call at a time, from any thread."""

    what = "the memory store"
    secure_delete = True

    def __init__(self, path: Path, limits: MemoryLimits) -> None:
        super().__init__(path)
        self.limits = limits

    def create(self, db: sqlite3.Connection) -> None:
        for statement in _statements(SCHEMA):
            db.execute(statement)

    # ------------------------------------------------------------------------------- writing
    def add_moment(self, session_id: str, at_ms: float, jpeg: bytes) -> Moment:
        """See ``MemoryStore.add_moment``."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO sessions (session_id) VALUES (?)", (session_id,))
            previous = db.execute(
                "SELECT moment_id FROM moments WHERE session_id = ? AND start_ms <= ?"
                " ORDER BY start_ms DESC, moment_id DESC LIMIT 1", (session_id, at_ms)).fetchone()
            following = db.execute(
                "SELECT MIN(start_ms) FROM moments WHERE session_id = ? AND start_ms > ?", (session_id, at_ms)
            ).fetchone()[0]
            if previous is not None:
                db.execute("UPDATE moments SET end_ms = ? WHERE moment_id = ?", (at_ms, previous[0]))
            moment_id = db.execute(
                "INSERT INTO moments (session_id, start_ms, end_ms, jpeg_bytes, bytes) VALUES (?, ?, ?, ?, ?)",
                (session_id, at_ms, following, len(jpeg), len(jpeg))).lastrowid
            db.execute("INSERT INTO jpegs (moment_id, data) VALUES (?, ?)", (moment_id, jpeg))
            db.execute(
                "UPDATE notes SET moment_id = ? WHERE session_id = ? AND at_ms >= ? AND at_ms < ?",
                (moment_id, session_id, at_ms, math.inf if following is None else following))
            self._enforce_limits(session_id, keep_moment=moment_id)
        return Moment(moment_id, session_id, at_ms, at_ms if following is None else following, len(jpeg), None)

    def set_caption(self, session_id: str, moment_id: int, caption: str) -> None:
        """See ``MemoryStore.set_caption``."""
        with self._transaction() as db:
            changed = db.execute(
                "UPDATE moments SET caption = ?, bytes = jpeg_bytes + ? WHERE moment_id = ? AND session_id = ?",
                (caption, text_bytes(caption), moment_id, session_id)).rowcount
            if changed:
                self._enforce_limits(session_id, keep_moment=moment_id)

    def add_note(self, session_id: str, kind: str, at_ms: float, text: str) -> Note:
        """See ``MemoryStore.add_note``."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO sessions (session_id) VALUES (?)", (session_id,))
            current = db.execute(
                "SELECT moment_id FROM moments WHERE session_id = ? AND start_ms <= ?"
                " ORDER BY start_ms DESC, moment_id DESC LIMIT 1", (session_id, at_ms)).fetchone()
            moment_id = None if current is None else current[0]
            note_id = db.execute(
                "INSERT INTO notes (session_id, kind, at_ms, text, moment_id, bytes) VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, kind, at_ms, text, moment_id, text_bytes(text))).lastrowid
            self._enforce_limits(session_id, keep_moment=moment_id, keep_note=note_id)
        return Note(note_id, session_id, checked_kind(kind), at_ms, text, moment_id)

    def clear(self, session_id: str) -> int:
        """See ``MemoryStore.clear``."""
        with self._transaction() as db:
            deleted = db.execute("DELETE FROM notes WHERE session_id = ?", (session_id,)).rowcount
            deleted += db.execute("DELETE FROM moments WHERE session_id = ?", (session_id,)).rowcount
            db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM handles WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM owners WHERE session_id = ?", (session_id,))
            if deleted:
                # FTS5 only marks deleted rows; merging the index into one segment drops their words.
                db.execute("INSERT INTO notes_fts (notes_fts) VALUES ('optimize')")
                db.execute("INSERT INTO captions_fts (captions_fts) VALUES ('optimize')")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted

    def sweep(self, now_ms: float) -> int:
        """See ``MemoryStore.sweep``."""
        cutoff = now_ms - self.limits.max_age_s * 1000
        with self._transaction() as db:
            deleted = db.execute("DELETE FROM notes WHERE at_ms < ?", (cutoff,)).rowcount
            deleted += db.execute(
                "DELETE FROM moments WHERE start_ms < ? AND COALESCE(end_ms, start_ms) < ?", (cutoff, cutoff)
            ).rowcount
            db.execute(
                "DELETE FROM sessions"
                " WHERE NOT EXISTS (SELECT 1 FROM moments m WHERE m.session_id = sessions.session_id)"
                " AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.session_id = sessions.session_id)")
            db.execute("DELETE FROM handles WHERE at_ms < ?", (cutoff,))
            db.execute("DELETE FROM owners WHERE at_ms < ? AND session_id NOT IN (SELECT session_id FROM sessions)",
                       (cutoff,))
        return deleted

    def claim(self, session_id: str, owner: str, at_ms: float) -> None:
        """See ``MemoryStore.claim``."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO owners (session_id, owner, at_ms) VALUES (?, ?, ?)",
                       (session_id, owner, at_ms))

    def owner(self, session_id: str) -> str | None:
        """See ``MemoryStore.owner``."""
        row = self.db.execute("SELECT owner FROM owners WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else row[0]

    def keep_handle(self, handle: str, session_id: str, owner: str, at_ms: float) -> None:
        """See ``MemoryStore.keep_handle``."""
        with self._transaction() as db:
            # REPLACE gives the row a new ``kept``: of handles kept at one instant, the later is the newer.
            db.execute(
                "INSERT OR REPLACE INTO handles (handle, session_id, owner, at_ms) VALUES (?, ?, ?, ?)",
                (handle, session_id, owner, at_ms))
            db.execute(
                "DELETE FROM handles WHERE session_id = :sid AND kept NOT IN (SELECT kept FROM handles"
                " WHERE session_id = :sid ORDER BY at_ms DESC, kept DESC LIMIT :most)",
                {"sid": session_id, "most": MAX_HANDLES_PER_SESSION})

    def take_handle(self, handle: str, owner: str) -> str | None:
        """See ``MemoryStore.take_handle``."""
        with self._transaction() as db:
            row = db.execute("SELECT kept, session_id, owner FROM handles WHERE handle = ?", (handle,)).fetchone()
            if row is None or not same_owner(row[2], owner):
                return None
            taken = db.execute("DELETE FROM handles WHERE kept = ?", (row[0],)).rowcount
        return row[1] if taken else None

    def _enforce_limits(self, session_id: str, keep_moment: int | None = None, keep_note: int | None = None) -> None:
        """Delete the oldest moments (each with its notes) of the session past its limit, then of
        any session past the store's; never ``keep_moment`` nor ``keep_note``."""
        for scope, limit in ((session_id, self.limits.max_session_bytes), (None, self.limits.max_bytes)):
            while self.usage(scope) > limit and self._delete_oldest(scope, keep_moment, keep_note):
                pass

    def _delete_oldest(self, session_id: str | None, keep_moment: int | None, keep_note: int | None) -> bool:
        """Delete the oldest moment of the session (of any session when None) with its notes and the
        notes before it, or else its oldest note. Returns whether anything was deleted."""
        db = self.db
        scope = "session_id = :sid" if session_id is not None else "1"
        params = {"sid": session_id, "keep_moment": keep_moment, "keep_note": keep_note}
        oldest = db.execute(
            f"SELECT moment_id, session_id, end_ms FROM moments WHERE {scope} AND moment_id IS NOT :keep_moment"
            " ORDER BY start_ms, moment_id LIMIT 1", params).fetchone()
        if oldest is not None:
            moment_id, owner, end_ms = oldest
            db.execute(
                "DELETE FROM notes WHERE session_id = ? AND note_id IS NOT ?"
                " AND (moment_id = ? OR (moment_id IS NULL AND at_ms < ?))",
                (owner, keep_note, moment_id, math.inf if end_ms is None else end_ms))
            db.execute("DELETE FROM moments WHERE moment_id = ?", (moment_id,))
            return True
        note = db.execute(
            f"SELECT note_id FROM notes WHERE {scope} AND note_id IS NOT :keep_note ORDER BY at_ms, note_id LIMIT 1",
            params).fetchone()
        if note is None:
            return False
        db.execute("DELETE FROM notes WHERE note_id = ?", note)
        return True

    # ------------------------------------------------------------------------------- reading
    def moments(self, session_id: str, from_ms: float | None, to_ms: float | None, limit: int) -> list[Moment]:
        """See ``MemoryStore.moments``."""
        low, high = _bounds(from_ms, to_ms)
        rows = self.db.execute(
            f"SELECT {_MOMENT_COLUMNS} FROM moments WHERE session_id = :sid AND start_ms >= {_RANGE_START}"
            " AND start_ms <= :to_ms ORDER BY start_ms, moment_id LIMIT :limit",
            {"sid": session_id, "from_ms": low, "to_ms": high, "limit": clamped(limit)}).fetchall()
        return [_moment(row) for row in rows]

    def spread(self, session_id: str, from_ms: float, to_ms: float, n: int) -> list[tuple[Moment, bytes]]:
        """See ``MemoryStore.spread``."""
        picked: dict[int, None] = {}
        for instant in spread_instants(float(from_ms), float(to_ms), n):
            row = self.db.execute(
                "SELECT moment_id FROM moments WHERE session_id = ? AND start_ms <= ?"
                " ORDER BY start_ms DESC, moment_id DESC LIMIT 1", (session_id, instant)).fetchone()
            if row is None:  # before the session's first moment: the first one of the range, if any
                row = self.db.execute(
                    "SELECT moment_id FROM moments WHERE session_id = ? AND start_ms > ? AND start_ms <= ?"
                    " ORDER BY start_ms, moment_id LIMIT 1", (session_id, instant, to_ms)).fetchone()
            if row is not None:
                picked[row[0]] = None
        if not picked:
            return []
        marks = ",".join("?" * len(picked))
        rows = self.db.execute(
            f"SELECT {', '.join('m.' + c for c in _MOMENT_COLUMNS.split(', '))}, j.data"
            f" FROM moments m JOIN jpegs j ON j.moment_id = m.moment_id WHERE m.moment_id IN ({marks})"
            " ORDER BY m.start_ms, m.moment_id", tuple(picked)).fetchall()
        return [(_moment(row[:-1]), row[-1]) for row in rows]

    def jpeg(self, session_id: str, moment_id: int) -> bytes | None:
        """See ``MemoryStore.jpeg``."""
        row = self.db.execute(
            "SELECT j.data FROM jpegs j JOIN moments m ON m.moment_id = j.moment_id"
            " WHERE j.moment_id = ? AND m.session_id = ?", (moment_id, session_id)).fetchone()
        return None if row is None else row[0]

    def search_text(
        self, session_id: str, text: str, from_ms: float | None, to_ms: float | None, limit: int
    ) -> list[TextHit]:
        """See ``MemoryStore.search_text``."""
        words = search_words(text)
        if not words or clamped(limit) == 0:
            return []
        low, high = _bounds(from_ms, to_ms)
        # Each word quoted as an FTS5 string: the user's text is never read as query syntax.
        query = " ".join(f'"{word}"' for word in words)
        params = {"sid": session_id, "query": query, "from_ms": low, "to_ms": high, "limit": clamped(limit)}
        rows = self.db.execute(
            "SELECT at_ms, kind, text, moment_id FROM ("
            " SELECT n.at_ms AS at_ms, n.kind AS kind, n.text AS text, n.moment_id AS moment_id"
            " FROM notes_fts JOIN notes n ON n.note_id = notes_fts.rowid"
            " WHERE notes_fts MATCH :query AND n.session_id = :sid AND n.at_ms BETWEEN :from_ms AND :to_ms"
            " UNION ALL"
            " SELECT m.start_ms, 'caption', m.caption, m.moment_id"
            " FROM captions_fts JOIN moments m ON m.moment_id = captions_fts.rowid"
            f" WHERE captions_fts MATCH :query AND m.session_id = :sid AND m.start_ms >= {_RANGE_START}"
            " AND m.start_ms <= :to_ms"
            ") ORDER BY at_ms DESC LIMIT :limit", params).fetchall()
        ids = sorted({row[3] for row in rows if row[3] is not None})
        marks = ",".join("?" * len(ids))
        found = {
            row[0]: _moment(row)
            for row in self.db.execute(f"SELECT {_MOMENT_COLUMNS} FROM moments WHERE moment_id IN ({marks})", ids)
        }
        return [TextHit(at_ms, kind, text, found.get(moment_id)) for at_ms, kind, text, moment_id in rows]

    def notes(self, session_id: str, from_ms: float | None, to_ms: float | None, limit: int) -> list[Note]:
        """See ``MemoryStore.notes``."""
        low, high = _bounds(from_ms, to_ms)
        rows = self.db.execute(
            f"SELECT {_NOTE_COLUMNS} FROM notes WHERE session_id = ? AND at_ms BETWEEN ? AND ?"
            " ORDER BY at_ms, note_id LIMIT ?", (session_id, low, high, clamped(limit))).fetchall()
        return [_note(row) for row in rows]

    def usage(self, session_id: str | None) -> int:
        """See ``MemoryStore.usage``."""
        if session_id is None:
            return self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM sessions").fetchone()[0]
        row = self.db.execute("SELECT bytes FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return 0 if row is None else row[0]

    def has(self, session_id: str) -> bool:
        """See ``MemoryStore.has``."""
        return bool(self.db.execute(
            "SELECT EXISTS (SELECT 1 FROM moments WHERE session_id = :sid)"
            " OR EXISTS (SELECT 1 FROM notes WHERE session_id = :sid)", {"sid": session_id}).fetchone()[0])


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script``, each whole (a trigger's body included)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement.strip()
            statement = ""


class SqliteMemoryStore(sqlite_file.OneJobAtATime, MemoryStore):
    """The session memory in the SQLite file at ``path``; each call is one job of its one connection."""

    backend = "sqlite"
    what = "the memory store"

    def __init__(self, path: Path, limits: MemoryLimits) -> None:
        self.path = path
        self.limits = limits
        self._database = SqliteDatabase(path, limits)

    async def add_moment(self, session_id: str, at_ms: float, jpeg: bytes) -> Moment:
        return await self._run(self._database.add_moment, checked_session(session_id), float(at_ms), bytes(jpeg))

    async def set_caption(self, session_id: str, moment_id: int, caption: str) -> None:
        await self._run(self._database.set_caption, checked_session(session_id), moment_id, stored_text(caption))

    async def add_note(self, session_id: str, kind: str, at_ms: float, text: str) -> Note:
        return await self._run(
            self._database.add_note, checked_session(session_id), checked_kind(kind), float(at_ms), stored_text(text))

    async def moments(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Moment]:
        return await self._run(self._database.moments, session_id, from_ms, to_ms, limit)

    async def spread(self, session_id: str, from_ms: float, to_ms: float, n: int) -> list[tuple[Moment, bytes]]:
        return await self._run(self._database.spread, session_id, from_ms, to_ms, n)

    async def jpeg(self, session_id: str, moment_id: int) -> bytes | None:
        return await self._run(self._database.jpeg, session_id, moment_id)

    async def search_text(
        self, session_id: str, text: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 20
    ) -> list[TextHit]:
        return await self._run(self._database.search_text, session_id, text, from_ms, to_ms, limit)

    async def notes(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Note]:
        return await self._run(self._database.notes, session_id, from_ms, to_ms, limit)

    async def clear(self, session_id: str) -> int:
        return await self._run(self._database.clear, session_id)

    async def sweep(self, now_ms: float) -> int:
        return await self._run(self._database.sweep, float(now_ms))

    async def keep_handle(self, handle: str, session_id: str, owner: str, at_ms: float) -> None:
        handle, owner = checked_handle(handle, owner)
        await self._run(self._database.keep_handle, handle, checked_session(session_id), owner, float(at_ms))

    async def take_handle(self, handle: str, owner: str) -> str | None:
        try:
            handle, owner = checked_handle(handle, owner)
        except ValueError:  # no store could have kept it
            return None
        return await self._run(self._database.take_handle, handle, owner)

    async def claim(self, session_id: str, owner: str, at_ms: float) -> None:
        _, owner = checked_handle("-", owner)
        await self._run(self._database.claim, checked_session(session_id), owner, float(at_ms))

    async def owner(self, session_id: str) -> str | None:
        return await self._run(self._database.owner, checked_session(session_id))

    async def usage(self, session_id: str | None = None) -> int:
        return await self._run(self._database.usage, session_id)

    async def has(self, session_id: str) -> bool:
        return await self._run(self._database.has, session_id)
