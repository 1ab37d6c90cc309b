"""The server's SQLite files (the memory store, the streams' outbox): opened the same way.

A file private to the server's user, one connection used from one thread at a time
(``check_same_thread`` off: the caller serialises), autocommit with explicit transactions, a
write-ahead log (WAL: readers of other connections, another server's included, never wait for a
writer, and a commit appends instead of rewriting pages), ``synchronous=NORMAL``, foreign keys
on, and other connections' locks waited for up to 10 s.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio

from server.blocking import run_blocking

T = TypeVar("T")


def connect(path: Path, *, secure_delete: bool = False) -> sqlite3.Connection:
    """Open (creating it private when new) the SQLite file at ``path``. ``secure_delete``:
    freed pages are zeroed (deleted data leaves the disk)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:  # only a new file: closing any descriptor of a file drops every POSIX lock this process
        # holds on it, the locks of this process's other connections to it included (SQLite
        # would then let another process write under them: "disk I/O error", a malformed file)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    except FileExistsError:
        pass
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        _write_ahead(db)
        pragmas = ["synchronous = NORMAL", "foreign_keys = ON"]
        if secure_delete:
            pragmas.append("secure_delete = ON")
        for pragma in pragmas:
            db.execute(f"PRAGMA {pragma}")
    except BaseException:
        db.close()
        raise
    return db


#: How long a connection waits for another's lock.
BUSY_TIMEOUT_S = 10.0


def _write_ahead(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode (kept in the file: once is enough). The switch needs the file to
    itself, and SQLite answers "database is locked" at once, without waiting, while another
    connection opens it: tried again for up to ``BUSY_TIMEOUT_S``."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` .. ``COMMIT``, rolled back on any exception."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class SqliteFile:
    """One SQLite file and its one connection (not thread-safe: one call at a time, from any
    thread). A subclass creates its schema in ``create`` (one transaction) and names itself in
    ``what``; ``secure_delete``: freed pages are zeroed."""

    what = "the database"
    secure_delete = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        """The open connection; raises RuntimeError before ``connect`` or after ``close``."""
        if self._db is None:
            raise RuntimeError(f"{self.what} {self.path} is not open")
        return self._db

    def create(self, db: sqlite3.Connection) -> None:
        """Create the schema if missing (in a transaction)."""

    def connect(self) -> None:
        """Open the file (made private to this user when new) and create the schema if missing."""
        db = connect(self.path, secure_delete=self.secure_delete)
        try:
            with transaction(db):
                self.create(db)
        except BaseException:
            db.close()
            raise
        self._db = db

    def close(self) -> None:
        """Close the connection (a second close does nothing)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self.db)


class Connectable(Protocol):
    def connect(self) -> None: ...

    def close(self) -> None: ...


class OneJobAtATime:
    """An async front for a database object whose calls block (``_database``: ``connect``,
    ``close`` and the rest): each call is one job off the event loop, through a limiter of one
    slot, so calls on its one connection never interleave."""

    _database: Connectable
    path: Path
    what = "the database"

    _limiter: anyio.CapacityLimiter | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            raise RuntimeError(f"{self.what} {self.path} is not open")
        return await run_blocking(fn, *args, limiter=self._limiter)

    async def open(self) -> None:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
            try:
                await self._run(self._database.connect)
            except BaseException:
                self._limiter = None
                raise

    async def close(self) -> None:
        if self._limiter is not None:
            await self._run(self._database.close)
            self._limiter = None
