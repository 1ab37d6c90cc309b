"""The outbox a server's settings name (see ``outbox.py``)."""

from __future__ import annotations

from pathlib import Path

from server.streams.outbox import Outbox

#: The SQLite file of the outbox inside the data directory.
SQLITE_FILE = "streams.sqlite3"


def open_outbox(memory_url: str | None, data_dir: Path, max_events: int) -> Outbox:
    """The outbox beside the session memory: PostgreSQL when ``memory_url`` names it (servers
    sharing it share their streams), otherwise SQLite in ``data_dir``. Not yet opened."""
    url = (memory_url or "").strip()
    if url.startswith(("postgresql://", "postgres://")):
        from server.streams.outbox_postgres import PostgresOutbox

        return PostgresOutbox(url, max_events)
    from server.streams.outbox_sqlite import SqliteOutbox

    return SqliteOutbox(data_dir / SQLITE_FILE, max_events)
