"""The colours models (``server.models.colours``), trained once per test run for every test
that needs a model that sees: a plugin of the root conftest, like tests/real_server.py.

Training takes 1.5-3 minutes a family on two cores, so no test module trains its own: the
first test that asks for a family trains it and later ones reuse it. The Qwen2.5-VL model is
trained the way ``livesight serve`` trains its demo model (``resolve_model`` with no model,
into an empty cache), so the demo path is what the tests run; the Idefics3 one, the family
vLLM serves, with ``make_colours_model``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Trained:
    """A trained colours model: where it is, the seconds training took, what it logged."""

    family: str
    path: Path
    train_s: float
    log: str


class ColoursModels:
    """The run's colours models, trained on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trained: dict[str, Trained] = {}

    def cache_dir(self) -> Path:
        """The empty cache the demo model is trained into (as ``livesight serve`` would)."""
        return self.root / "cache"

    def get(self, family: str) -> Trained:
        """The colours model of ``family``, trained now if no test has asked for it yet."""
        if family not in self._trained:
            self._trained[family] = self._train(family)
        return self._trained[family]

    def _train(self, family: str) -> Trained:
        from server.models.colours import make_colours_model
        from server.models.demo import DEMO_FAMILY, resolve_model
        from server.settings import Settings

        lines: list[str] = []
        handler = _ListHandler(lines)
        logger = logging.getLogger("livesight.server")
        logger.addHandler(handler)
        started = time.perf_counter()
        try:
            if family == DEMO_FAMILY:
                path = Path(resolve_model(Settings(cache_dir=self.cache_dir())))
            else:
                path = make_colours_model(self.root / family, family, progress=print)
        finally:
            logger.removeHandler(handler)
        return Trained(family, path, time.perf_counter() - started, "\n".join(lines))


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="session")
def colours_models(tmp_path_factory: pytest.TempPathFactory) -> ColoursModels:
    """The run's colours models of both families, each trained when first asked for."""
    return ColoursModels(tmp_path_factory.mktemp("colours-models"))
