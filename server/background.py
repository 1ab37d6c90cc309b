"""Running the server inside another program (benchmarks, tests): uvicorn in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from server.app import WS_PATH, create_app
from server.drain import DrainingServer
from server.engines.base import Engine
from server.listener import uvicorn_config
from server.settings import Settings


@dataclass
class RunningServer:
    host: str
    port: int
    app: Any
    engine: Engine

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}{WS_PATH}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"


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
