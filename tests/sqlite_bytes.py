"""What a SQLite file and its write-ahead log hold on disk, read by another process: opening and
closing a descriptor of the file here would drop the POSIX locks of this process's connections
to it (a server running in the test's process), and SQLite would no longer be safe from other
writers."""

from __future__ import annotations

import subprocess
from pathlib import Path


def bytes_on_disk(database: Path) -> bytes:
    """The bytes of ``database`` and of its ``-wal`` file (when there is one), read by ``cat``."""
    files = [str(p) for p in (database, database.with_name(database.name + "-wal")) if p.exists()]
    return subprocess.run(["cat", *files], capture_output=True, check=True).stdout
