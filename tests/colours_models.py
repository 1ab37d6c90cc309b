"""The colours models (``server.models.colours``), trained once per test run for every test
that needs a model that sees: a plugin of the root conftest, like tests/real_server.py.

Training takes 2-3 minutes a family and uses one thread, so the first test that asks for
either family starts both trainings at once, each in a process of its own (two cores: about
the time of one), and waits for the one it asked for; later tests reuse them. The Qwen2.5-VL
model is trained the way ``livesight serve`` trains its demo model (``resolve_model`` with no
model, into an empty cache, in a fresh process whose log is kept), so the demo path is what
the tests run; the Idefics3 one, the family vLLM serves, with ``livesight make-tiny-model
--task colours``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TRAIN_TIMEOUT_S = 900
#: The demo path in a process of its own: what ``livesight serve`` does first with no model.
_DEMO = (
    "import logging, sys; from pathlib import Path; "
    "logging.basicConfig(level=logging.WARNING, format='%(message)s'); "
    "from server.models.demo import resolve_model; from server.settings import Settings; "
    "print(resolve_model(Settings(cache_dir=Path(sys.argv[1]))))"
)


@dataclass(frozen=True)
class Trained:
    """A trained colours model: where it is, the seconds training took, what it logged."""

    family: str
    path: Path
    train_s: float
    log: str


@dataclass
class _Training:
    proc: subprocess.Popen
    log_path: Path
    started: float
    path: Path | None  # known in advance (make-tiny-model), else printed by the demo path


class ColoursModels:
    """The run's colours models, trained on first use (both families together)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._running: dict[str, _Training] = {}
        self._trained: dict[str, Trained] = {}

    def cache_dir(self) -> Path:
        """The empty cache the demo model is trained into (as ``livesight serve`` would)."""
        return self.root / "cache"

    def get(self, family: str) -> Trained:
        """The colours model of ``family``, trained now (with the other family beside it) if
        no test has asked for one yet. Fails the test when training fails."""
        if not self._running:
            self._start_all()
        if family not in self._trained:
            self._trained[family] = self._wait(family)
        return self._trained[family]

    def _start_all(self) -> None:
        from server.models.demo import DEMO_FAMILY
        from server.models.tiny import FAMILIES

        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        for family in FAMILIES:
            log_path = self.root / f"train-{family}.log"
            if family == DEMO_FAMILY:
                command, path = [sys.executable, "-c", _DEMO, str(self.cache_dir())], None
            else:
                path = self.root / family
                command = [sys.executable, "-m", "server.cli", "make-tiny-model", str(path), "--family", family,
                           "--task", "colours"]
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            self._running[family] = _Training(proc, log_path, time.perf_counter(), path)

    def _wait(self, family: str) -> Trained:
        training = self._running[family]
        try:
            code = training.proc.wait(timeout=TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            training.proc.kill()
            code = None
        log = training.log_path.read_text(encoding="utf-8", errors="replace")
        if code != 0:
            pytest.fail(f"training the {family} colours model failed ({code}):\n{log[-3000:]}")
        seconds = time.perf_counter() - training.started
        path = training.path or Path(log.strip().splitlines()[-1])
        return Trained(family, path, seconds, log)

    def close(self) -> None:
        """Stop trainings no test waited for."""
        for training in self._running.values():
            if training.proc.poll() is None:
                training.proc.kill()
                training.proc.wait()


@pytest.fixture(scope="session")
def colours_models(tmp_path_factory: pytest.TempPathFactory):
    """The run's colours models of both families, trained when first asked for."""
    models = ColoursModels(tmp_path_factory.mktemp("colours-models"))
    yield models
    models.close()
