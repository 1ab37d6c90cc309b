"""The colours models (``server.models.colours``) for every test that needs a model that sees,
and the run's reproduction of the demo model's training: a plugin of the root conftest, like
tests/real_server.py.

The models are the ones livesight ships (``server/models/weights/``, one per family): the
demo model (Qwen2.5-VL) that ``livesight serve`` serves with no model, and the Idefics3 one,
the family vLLM serves. A test asking for one fails when it is missing or was written by
another version of the recipe (write them again with ``make demo-models``).

Training is deterministic, so the run checks that the shipped demo model is what the recipe
makes: when a test asks for ``demo_training``, the training starts as the run's tests are
collected, in a process of its own at the lowest CPU priority (one thread: it takes the time
the other tests leave idle), and that test runs last, when the model is (nearly) trained.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TRAIN_TIMEOUT_S = 1800
#: The fixture that asks for the run's training of the demo model.
TRAINING_FIXTURE = "demo_training"
_TRAINING = pytest.StashKey["DemoTraining"]()


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
class Trained:
    """The demo model trained by this run: where, the seconds it took, what it printed."""

    path: Path
    train_s: float
    log: str


class DemoTraining:
    """``livesight make-tiny-model DIR --task colours`` for the demo family, in the background."""

    def __init__(self, root: Path) -> None:
        from server.models.demo import DEMO_FAMILY

        self.path = root / DEMO_FAMILY
        self.log_path = root / "train.log"
        command = ["nice", "-n", "19", sys.executable, "-m", "server.cli", "make-tiny-model", str(self.path),
                   "--family", DEMO_FAMILY, "--task", "colours"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self.started = time.perf_counter()

    def wait(self) -> Trained:
        """The trained model; fails the test when training fails or takes over ``TRAIN_TIMEOUT_S``."""
        try:
            code = self.proc.wait(timeout=max(1.0, TRAIN_TIMEOUT_S - (time.perf_counter() - self.started)))
        except subprocess.TimeoutExpired:
            self.close()
            code = None
        log = self.log_path.read_text(encoding="utf-8", errors="replace")
        if code != 0:
            pytest.fail(f"training the demo model failed ({code}):\n{log[-3000:]}")
        return Trained(self.path, time.perf_counter() - self.started, log)

    def close(self) -> None:
        """Stop the training if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """When a selected test asks for the demo model's training, start it now and run that test last."""
    wanting = [item for item in items if TRAINING_FIXTURE in getattr(item, "fixturenames", ())]
    if not wanting or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in wanting] + wanting
    root = config._tmp_path_factory.mktemp("demo-training")  # type: ignore[attr-defined]
    config.stash[_TRAINING] = DemoTraining(root)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A training no test waited for (the run was cut short) is stopped."""
    training = config.stash.get(_TRAINING, None)
    if training is not None:
        training.close()


@pytest.fixture(scope="session")
def demo_training(pytestconfig: pytest.Config) -> Trained:
    """The demo model as this run trained it (started at collection, waited for here)."""
    training = pytestconfig.stash.get(_TRAINING, None)
    if training is None:  # asked for outside a collected run (a fixture of a fixture): start it now
        training = DemoTraining(pytestconfig._tmp_path_factory.mktemp("demo-training"))  # type: ignore[attr-defined]
        pytestconfig.stash[_TRAINING] = training
    return training.wait()
