"""A real, throwaway PostgreSQL server for the tests (fixture ``postgres_url``), one per test run.

Debian's postgresql package installs the server without starting one: ``initdb`` makes a fresh
cluster in a temporary directory and ``pg_ctl`` runs it on a free port of 127.0.0.1, with
durability off (nothing of it outlives the run). Then it is stopped and its directory removed.
PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` user, and its
directory lies where that user can reach it (the run's own temporary directory is private).

Missing binaries fail the test: the suite's components are installed (``make system-deps``),
never skipped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Where Debian puts each PostgreSQL version's programs.
BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: The superuser of the test cluster (no password: trust on 127.0.0.1 only).
USER = "livesight"
START_TIMEOUT_S = 30


@dataclass(frozen=True)
class PostgresServer:
    """A running throwaway cluster: its programs, data directory and port."""

    bin_dir: Path
    data_dir: Path
    port: int

    @property
    def url(self) -> str:
        """The URL of its ``postgres`` database."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"


def find_bin_dir() -> Path:
    """The programs of the newest PostgreSQL installed; raises RuntimeError when there is none."""
    found = [p for p in Path("/").glob(BIN_GLOB.lstrip("/")) if (p / "initdb").exists() and (p / "pg_ctl").exists()]
    if not found:
        raise RuntimeError(
            f"no PostgreSQL server programs in {BIN_GLOB}: install Debian's postgresql package"
            " (make system-deps; it is in the Makefile's APT_PACKAGES)")
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


def _as_root() -> bool:
    return os.geteuid() == 0


def _runner() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if _as_root() else []


def _reachable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _parent_dir() -> Path:
    """Where the cluster's directory goes: the temporary directory, or as root the first of the
    usual ones that the postgres user can reach."""
    candidates = [Path(tempfile.gettempdir())]
    if not _as_root():
        return candidates[0]
    candidates += [Path("/tmp"), Path("/var/tmp")]
    for candidate in candidates:
        if candidate.is_dir() and _reachable_by_others(candidate):
            return candidate
    raise RuntimeError(f"none of {[str(c) for c in candidates]} can be reached by the postgres user")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL program (as the postgres user when root); returns how it ended."""
    return subprocess.run([*_runner(), *args], capture_output=True, text=True, timeout=timeout_s, check=False)


def _ran(args: list[str], what: str) -> None:
    done = _run(args)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")


def start_postgres() -> PostgresServer:
    """Make and start a fresh cluster; raises RuntimeError (with its log) when it cannot."""
    bin_dir = find_bin_dir()
    data_dir = Path(tempfile.mkdtemp(prefix="livesight-pg-", dir=_parent_dir()))
    log = data_dir / "server.log"
    try:
        if _as_root():
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("PostgreSQL refuses root, and there is no postgres user to run it as") from None
            os.chown(data_dir, owner.pw_uid, owner.pw_gid)
        _ran([str(bin_dir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", USER, "-E", "UTF8", "--locale=C",
              "--no-sync"], "initdb")
        for _ in range(3):  # a port found free can be taken before the server binds it
            server = PostgresServer(bin_dir, data_dir, _free_port())
            options = (f"-p {server.port} -k {data_dir} -c listen_addresses=127.0.0.1"
                       " -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            done = _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(log), "-w",
                         "-t", str(START_TIMEOUT_S), "start"], START_TIMEOUT_S + 5)
            if done.returncode == 0:
                return server
        raise RuntimeError(f"pg_ctl start failed: {done.stderr[-1000:]}\n{_tail(log)}")
    except BaseException:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "stop"])  # one half started
        shutil.rmtree(data_dir, ignore_errors=True)
        raise


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def stop_postgres(server: PostgresServer) -> None:
    """Stop the cluster at once and remove its directory."""
    try:
        _ran([str(server.bin_dir / "pg_ctl"), "-D", str(server.data_dir), "-m", "immediate", "-w", "stop"],
             "pg_ctl stop")
    finally:
        shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a real PostgreSQL server's ``postgres`` database, started once per test run."""
    server = start_postgres()
    try:
        yield server.url
    finally:
        stop_postgres(server)


async def create_database(admin_url: str, prefix: str) -> str:
    """A new, empty database on the server of ``admin_url``; returns its URL (drop it with
    ``drop_database``)."""
    import uuid

    import asyncpg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return admin_url.rsplit("/", 1)[0] + "/" + name


async def drop_database(admin_url: str, url: str) -> None:
    """Drop the database of ``url`` (made by ``create_database``), its connections and all."""
    import asyncpg

    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await admin.close()
