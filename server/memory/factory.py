"""Which session memory backend a URL names."""

from __future__ import annotations

from pathlib import Path

from server.memory.store import MemoryLimits, MemoryStore

#: The SQLite file of a store named by no URL, inside the data directory.
DEFAULT_SQLITE_FILE = "memory.sqlite3"


def open_store(url: str | None, data_dir: Path, limits: MemoryLimits) -> MemoryStore:
    """The store ``url`` names, not yet opened (``await store.open()``).

    None or ``sqlite://`` alone: SQLite in ``data_dir / "memory.sqlite3"``; ``sqlite:///abs/file.db``:
    that file; ``sqlite://rel/file.db``: that file under ``data_dir``; ``postgresql://...`` or
    ``postgres://...``: that PostgreSQL database. Raises ValueError for any other URL.
    """
    url = (url or "").strip() or None  # an empty setting (a compose file's unset variable) is the default
    if url is None or url.startswith("sqlite://"):
        from server.memory.sqlite_store import SqliteMemoryStore

        path = Path(url.removeprefix("sqlite://")) if url else Path()
        if path == Path():
            path = Path(DEFAULT_SQLITE_FILE)
        return SqliteMemoryStore(path if path.is_absolute() else data_dir / path, limits)
    if url.startswith(("postgresql://", "postgres://")):
        from server.memory.postgres_store import PostgresMemoryStore

        return PostgresMemoryStore(url, limits)
    raise ValueError(
        "the memory store URL must start with sqlite:// (sqlite:///absolute/file.db, sqlite://file-in-data-dir.db)"
        f" or postgresql://, not {url.split('://', 1)[0] + '://' if '://' in url else repr(url)}"
    )
