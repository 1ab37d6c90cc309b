"""HAProxy as docker/haproxy.cfg runs it, in front of livesight gateways and vLLM servers on
this machine: for the routing tests and benchmarks.

``haproxy`` starts the Debian package's ``haproxy`` on the repository's config with the
addresses in its environment, waits until it forwards to a healthy server of each tier that
was given, and stops it on exit. Its log (one line per request, with the session's routing key
or ``X-Session-ID``, and the server that took it) is parsed by ``Haproxy.requests``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from server.background import free_port, stop_process

CONFIG = Path(__file__).resolve().parents[2] / "docker" / "haproxy.cfg"
#: One request of HAProxy's log (``option httplog`` with one captured value): its backend, server,
#: status, captured routing key or session header, and path.
_REQUEST = re.compile(r" (\w+)/(\S+) \S+ (\d{3}) .*?\{([^}]*)\} \"\S+ (\S+)")
_UNUSED = "127.0.0.1:1"  # a tier not given: its servers stay down


@dataclass(frozen=True)
class Request:
    """One request HAProxy forwarded (or could not)."""

    backend: str
    server: str
    status: int
    key: str  # the routing key (gateways) or X-Session-ID (vLLM)
    path: str


@dataclass
class Haproxy:
    """A running HAProxy: its two listening URLs and its log."""

    proc: subprocess.Popen
    gateways_url: str  # http://host:port of the gateway tier
    vllm_url: str  # http://host:port of the vLLM tier
    log_path: Path

    def requests(self) -> list[Request]:
        """Every request in the log so far."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return [Request(m[1], m[2], int(m[3]), m[4], m[5]) for m in _REQUEST.finditer(text)]


@contextmanager
def haproxy(log_path: Path, gateways: list[str] = (), vllms: list[str] = (),
            start_timeout_s: float = 60) -> Iterator[Haproxy]:
    """HAProxy on ``docker/haproxy.cfg`` with up to two gateways and two vLLM servers
    (``host:port``). Raises ``RuntimeError`` when HAProxy is missing or does not forward."""
    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("haproxy is not installed (make system-deps installs it)")
    gateways_port, vllm_port = free_port(), free_port()
    env = {
        **os.environ,
        "HAPROXY_GATEWAYS_BIND": f"127.0.0.1:{gateways_port}",
        "HAPROXY_VLLM_BIND": f"127.0.0.1:{vllm_port}",
        "LIVESIGHT_GATEWAY_1": _nth(gateways, 0), "LIVESIGHT_GATEWAY_2": _nth(gateways, 1),
        "VLLM_1": _nth(vllms, 0), "VLLM_2": _nth(vllms, 1),
    }
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([binary, "-db", "-f", str(CONFIG)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    running = Haproxy(proc, f"http://127.0.0.1:{gateways_port}", f"http://127.0.0.1:{vllm_port}", log_path)
    try:
        if gateways:
            _wait_forwarding(running, running.gateways_url + "/healthz", start_timeout_s)
        if vllms:
            _wait_forwarding(running, running.vllm_url + "/health", start_timeout_s)
        yield running
    finally:
        stop_process(proc, group=True)


def _nth(addresses: list[str], index: int) -> str:
    return addresses[index] if len(addresses) > index else _UNUSED


def _wait_forwarding(running: Haproxy, url: str, timeout_s: float) -> None:
    """Until ``url`` through HAProxy answers 200 (a server of that tier is up and checked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {running.log_path.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"haproxy does not forward {url}: {running.log_path.read_text(errors='replace')[-2000:]}")
