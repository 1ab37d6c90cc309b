"""The colours models (``server.models.colours``) for every test that needs a model that sees,
and the run's reproduction of the demo model's training: a plugin of the root conftest, like
tests/real_server.py.

The models are the ones livesight ships (``server/models/weights/``, one per family): the
demo model (Qwen2.5-VL) that ``livesight serve`` serves with no model, and the Idefics3 one,
the family vLLM serves. A test asking for one fails when it is missing or was written by
another version of the recipe (write them again with ``make demo-models``).

Training is deterministic, so the run checks that the shipped demo model is what the recipe
makes: when a test asks for ``demo_training``, ``livesight make-tiny-model DIR --task colours
--retrace`` starts as the run's tests are collected (by the first of the run's processes to
collect that test), in a process of its own at the lowest CPU priority (one thread: it takes
the time the other tests leave idle), and trains the recipe again as far as the fingerprints
the shipped card records; that test runs last and waits for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TRAIN_TIMEOUT_S = 900
#: The fixture that asks for the run's training of the demo model.
TRAINING_FIXTURE = "demo_training"


@dataclass(frozen=True)
class ColoursModel:
    """A shipped colours model: its family and where it is."""

    family: str
    path: Path


class ShippedModels:
    """The colours models shipped with livesight, checked current when a test asks for one."""

    def get(self, family: str) -> ColoursModel:
        """The shipped colours model of ``family``; fails the test when it is missing or stale."""
        from server.models.colours import read_colours_card
        from server.models.demo import shipped_model_dir

        path = shipped_model_dir(family)
        card = read_colours_card(path) if path.is_dir() else None
        if card is None or not card.current:
            pytest.fail(f"no current {family} colours model at {path}: write it with `make demo-models`")
        return ColoursModel(family, path)


@pytest.fixture(scope="session")
def colours_models() -> ShippedModels:
    """The colours models shipped with livesight, of both families."""
    return ShippedModels()


@dataclass(frozen=True)
class Retraced:
    """The run's retrace of the demo model: its exit status, the seconds it took, what it printed."""

    code: int
    seconds: float
    log: str


class DemoTraining:
    """``livesight make-tiny-model DIR --task colours --retrace`` on the shipped demo model, in the
    background, in a process group of its own that writes into a folder of the run: its output
    (``retrace.log``), its process id (``pid``) and, once it ends, its exit status (``status``),
    so whichever of the run's processes runs the test can wait for it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log_path, self.pid_path, self.status_path = (folder / n for n in ("retrace.log", "pid", "status"))

    def start(self) -> bool:
        """Start it unless a process of the run has (the first makes the folder); True if this one did."""
        from server.models.demo import DEMO_FAMILY, shipped_model_dir

        try:
            self.folder.mkdir()
        except FileExistsError:
            return False
        retrace = ["nice", "-n", "19", sys.executable, "-m", "server.cli", "make-tiny-model",
                   str(shipped_model_dir(DEMO_FAMILY)), "--task", "colours", "--retrace"]
        script = '"$@" >"$RETRACE_LOG" 2>&1; echo $? >"$RETRACE_STATUS.part"; mv "$RETRACE_STATUS.part" "$RETRACE_STATUS"'
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "RETRACE_LOG": str(self.log_path),
               "RETRACE_STATUS": str(self.status_path)}
        proc = subprocess.Popen(["sh", "-c", script, "sh", *retrace], env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid_path.write_text(str(proc.pid), encoding="utf-8")
        return True

    def wait(self) -> Retraced:
        """How the retrace ended; fails the test when it takes over ``TRAIN_TIMEOUT_S``."""
        deadline = time.monotonic() + TRAIN_TIMEOUT_S - self._age()
        while not self.status_path.exists():
            if time.monotonic() > deadline:
                self.close()
                pytest.fail(f"retracing the demo model's training took over {TRAIN_TIMEOUT_S} s")
            time.sleep(0.5)
        code = int(self.status_path.read_text(encoding="utf-8").strip())
        return Retraced(code, self._age(self.status_path), self.log_path.read_text(encoding="utf-8", errors="replace"))

    def close(self) -> None:
        """Stop the retrace if it still runs."""
        if self.status_path.exists() or not self.pid_path.exists():
            return
        try:
            os.killpg(int(self.pid_path.read_text(encoding="utf-8")), signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _age(self, until: Path | None = None) -> float:
        """Seconds since the retrace started (until ``until`` was written)."""
        end = until.stat().st_mtime if until is not None else time.time()
        return end - self.pid_path.stat().st_mtime if self.pid_path.exists() else 0.0


def _training(config: pytest.Config) -> DemoTraining:
    from tests.conftest import run_root

    return DemoTraining(run_root(config) / "demo-retrace")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """When a selected test asks for the demo model's retrace, start it now (the run's first
    process to collect that test does) and run that test last."""
    wanting = [item for item in items if TRAINING_FIXTURE in getattr(item, "fixturenames", ())]
    if not wanting or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in wanting] + wanting
    _training(config).start()


@pytest.hookimpl(tryfirst=True)  # before the run's temporary directory goes
def pytest_unconfigure(config: pytest.Config) -> None:
    """A retrace no test waited for (the run was cut short) is stopped by the process that started the run."""
    from tests.conftest import is_worker

    if not is_worker(config):
        _training(config).close()


@pytest.fixture(scope="session")
def demo_training(pytestconfig: pytest.Config) -> Retraced:
    """The run's retrace of the demo model's training (started at collection, waited for here)."""
    training = _training(pytestconfig)
    training.start()  # asked for outside a collected run (a fixture of a fixture): start it now
    return training.wait()
