"""The server's SQLite files (the memory store, the streams' outbox): opened the same way.

A file private to the server's user, one connection used from one thread at a time
(``check_same_thread`` off: the caller serialises), autocommit with explicit transactions, a
rollback journal (see ``server/memory/sqlite_store.py`` for why not WAL), ``synchronous=NORMAL``,
foreign keys on, and other connections' locks waited for up to 10 s.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def connect(path: Path, *, secure_delete: bool = False) -> sqlite3.Connection:
    """Open (creating it private when new) the SQLite file at ``path``. ``secure_delete``:
    freed pages are zeroed (deleted data leaves the disk)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        pragmas = ["busy_timeout = 10000", "journal_mode = TRUNCATE", "synchronous = NORMAL", "foreign_keys = ON"]
        if secure_delete:
            pragmas.append("secure_delete = ON")
        for pragma in pragmas:
            db.execute(f"PRAGMA {pragma}")
    except BaseException:
        db.close()
        raise
    return db


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
