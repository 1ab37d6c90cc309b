"""The models served when none is configured: generated here once, never downloaded.

- The **demo model** (``livesight serve`` with no ``--model``) is the tiny colours model
  (``server.models.colours``), trained on this machine the first time it is needed (about two
  minutes on two cores, with a progress line): a newcomer's first questions about the
  screen's colour get right answers, and a watch such as "Is the screen red?" fires on the
  right frame.
- The **random model** is the tiny random-weight model (``server.models.tiny``) with the
  shapes of a real one (larger images, more tokens per frame): what the benchmarks serve
  unless given ``--model``, so their figures measure the pipeline, not a toy's few tokens.

Both live in the settings' ``cache_dir`` and are written atomically: a half-written model is
never used.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from server.settings import Settings

log = logging.getLogger("livesight.server")
DEMO_FAMILY = "qwen2_5_vl"
DEMO_VERSION = "4"  # 1 was the random-weight model, now the random model below; 2 small frames; 3 no long prompts
RANDOM_VERSION = "1"


def demo_model_dir(settings: Settings) -> Path:
    """Where the demo (colours) model for ``settings`` lives, generated or not."""
    return settings.cache_dir / f"demo-{DEMO_FAMILY}-colours-v{DEMO_VERSION}"


def random_model_dir(settings: Settings) -> Path:
    """Where the random-weight model lives (the path the demo model had before it could see)."""
    return settings.cache_dir / f"demo-{DEMO_FAMILY}-v{RANDOM_VERSION}"


def resolve_model(settings: Settings) -> str:
    """The model path to load: ``settings.model`` or the demo model, trained here if missing."""
    if settings.model:
        return settings.model
    target = demo_model_dir(settings)
    card = _card(target)
    if card is None:
        log.warning(
            "no --model given: training the demo model (the tiny colours model, %s) into %s; about "
            "three minutes on two cores, once",
            DEMO_FAMILY, target,
        )
        _generate(target, _train_colours, lambda: _card(target) is not None)
        card = _card(target)
    log.warning(
        "serving the generated DEMO model at %s: a tiny model trained here that sees one thing, the "
        "screen's colour (%s). Ask 'What colour is the screen?' or watch 'Is the screen red?' "
        "(held-out accuracy: naming %.2f, yes/no %.2f); anything else gets noise. To serve a real "
        "model: livesight serve --model Qwen/Qwen2.5-VL-3B-Instruct (or a local path, e.g. a SmolVLM "
        "checkpoint)",
        target, ", ".join(card.colour_token_ids), card.accuracy["naming"], card.accuracy["yes_no"],
    )
    return str(target)


def resolve_random_model(settings: Settings) -> str:
    """The random-weight model's path, generated (in seconds) if missing."""
    from server.models.tiny import is_demo_model, make_tiny_model

    target = random_model_dir(settings)
    _generate(target, lambda out: make_tiny_model(out, family=DEMO_FAMILY), lambda: is_demo_model(target))
    return str(target)


def _card(target: Path):
    """The colours card at ``target``, or None where there is no usable demo model there yet."""
    from server.models.colours import read_colours_card

    try:
        return read_colours_card(target)
    except ValueError:
        log.warning("the demo model at %s is broken: it will be trained again", target)
        return None


def _train_colours(out: Path) -> None:
    from server.models.colours import make_colours_model

    make_colours_model(out, family=DEMO_FAMILY)


def _generate(target: Path, make: Callable[[Path], object], ready: Callable[[], bool]) -> None:
    """Write a model into ``target`` with ``make`` unless ``ready()`` already; atomically."""
    if ready():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=target.parent))
    try:
        make(tmp)
        if ready():  # another process finished first: use its model
            return
        shutil.rmtree(target, ignore_errors=True)  # what an interrupted or broken run left
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
