"""Running the server from another program (benchmarks, tests): uvicorn in a thread
(``run_server``), or ``livesight serve`` in a process of its own (``serve_process``)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from server.app import WS_PATH, create_app
from server.drain import DrainingServer
from server.engines.base import Engine
from server.listener import uvicorn_config
from server.settings import Settings


@dataclass
class ServerAddress:
    """Where a livesight server listens."""

    host: str
    port: int

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}{WS_PATH}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class RunningServer(ServerAddress):
    """The server running in a thread of this process."""

    app: Any
    engine: Engine


@contextmanager
def run_server(settings: Settings, engine: Engine | None = None, start_timeout_s: float = 300) -> Iterator[RunningServer]:
    """Serve on ``settings.host`` at a free port in a background thread; stopped on exit.

    Raises ``RuntimeError`` when the server does not start.
    """
    app = create_app(settings, engine)
    config = uvicorn_config(app, settings, port=0, log_level="warning")
    server = DrainingServer(config, app.state.drain)
    thread = threading.Thread(target=server.run, name="livesight-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start (see the log above)")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(settings.host, port, app, app.state.engine)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# ---------------------------------------------------------------------- a server process

ROOT = Path(__file__).resolve().parent.parent  # where ``python -m server.cli`` finds this code


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _log_tail(log_path: Path | None) -> str:
    return f":\n{log_path.read_text()[-3000:]}" if log_path and log_path.exists() else " (see the log above)"


def wait_healthy(
    url: str, proc: subprocess.Popen, timeout_s: float = 300, log_path: Path | None = None,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Wait until ``url`` (a health endpoint of the server ``proc`` runs) answers 200
    (``verify``: how to check a TLS server's certificate).
    Raises ``RuntimeError`` with the log's tail when the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}){_log_tail(log_path)}")
        try:
            if httpx.get(url, timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start in {timeout_s:g} s{_log_tail(log_path)}")
        time.sleep(0.2)


def stop_process(proc: subprocess.Popen, timeout_s: float = 30, *, group: bool = False) -> None:
    """SIGTERM ``proc`` (its whole process group with ``group``), SIGKILL after ``timeout_s``."""
    send = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    if proc.poll() is None:
        send(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()


@dataclass
class ServedProcess(ServerAddress):
    """``livesight serve`` running in a process of its own."""

    proc: subprocess.Popen
    log_path: Path | None

    def log(self) -> str:
        """What the server has logged so far ("" without a log file)."""
        return self.log_path.read_text() if self.log_path else ""


@contextmanager
def serve_process(
    args: list[str], *, log_path: Path | None = None, env: dict[str, str] | None = None,
    start_timeout_s: float = 300, stop_timeout_s: float = 30, tls_ca: Path | None = None,
) -> Iterator[ServedProcess]:
    """Run ``livesight serve ARGS`` on a free port (stdout and stderr to ``log_path``, else to
    this process's); returns once ``/healthz`` answers (over https, trusting ``tls_ca``, when
    given: ARGS serve TLS). ``env``: the environment (default this one with
    ``HF_HUB_OFFLINE=1``). On exit a server still running gets SIGTERM (a drain), then
    SIGKILL after ``stop_timeout_s``.

    Raises ``RuntimeError`` (with the log's tail) when the server does not start.
    """
    port = free_port()
    command = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    env = env if env is not None else {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = log_path.open("ab") if log_path else None
    try:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
    finally:
        if log:
            log.close()
    served = ServedProcess("127.0.0.1", port, proc, log_path)
    try:
        if tls_ca is None:
            wait_healthy(served.http_url + "/healthz", proc, start_timeout_s, log_path)
        else:
            url = f"https://{served.host}:{served.port}/healthz"
            wait_healthy(url, proc, start_timeout_s, log_path, verify=ssl.create_default_context(cafile=str(tls_ca)))
        yield served
    finally:
        stop_process(proc, stop_timeout_s)
