"""The models served when none is configured: shipped with livesight or generated here, never
downloaded.

- The **demo model** (``livesight serve`` with no ``--model``) is the tiny colours model
  (``server.models.colours``). Its weights ship with livesight (``server/models/weights/``, a
  few MB, written by ``livesight make-tiny-model DIR --task colours``; training is deterministic
  and a test reproduces it), so a newcomer's server answers within seconds of starting, with no
  training: questions about the screen's colour get right answers, and a watch such as "Is the
  screen red?" fires on the right frame. Where the shipped copy is missing or of another version
  it is trained into the cache instead (a few minutes on two cores, with progress lines).
- The **random model** is the tiny random-weight model (``server.models.tiny``) with the
  shapes of a real one (larger images, more tokens per frame): what the benchmarks serve
  unless given ``--model``, so their figures measure the pipeline, not a toy's few tokens.

Generated models live in the settings' ``cache_dir`` and are written atomically: a
half-written model is never used.
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
#: The seed the shipped demo model was trained with (``make demo-models``; its card says it too).
DEMO_SEED = 2
RANDOM_VERSION = "1"
#: The colours models shipped with livesight, one folder a family (``shipped_model_dir``).
SHIPPED_DIR = Path(__file__).resolve().parent / "weights"


def shipped_model_dir(family: str = DEMO_FAMILY) -> Path:
    """Where the colours model of ``family`` shipped with livesight lives."""
    return SHIPPED_DIR / f"colours-{family}"


def demo_model_dir(settings: Settings) -> Path:
    """Where the demo (colours) model for ``settings`` lives, generated or not."""
    from server.models.colours import VERSION

    return settings.cache_dir / f"demo-{DEMO_FAMILY}-colours-v{VERSION}"


def random_model_dir(settings: Settings) -> Path:
    """Where the random-weight model lives (the path the demo model had before it could see)."""
    return settings.cache_dir / f"demo-{DEMO_FAMILY}-v{RANDOM_VERSION}"


def resolve_model(settings: Settings) -> str:
    """The model path to load: ``settings.model``, else the shipped demo model, else the demo
    model trained into the cache (trained now if missing)."""
    if settings.model:
        return settings.model
    target = shipped_model_dir()
    card = _card(target)
    if card is None:
        target = demo_model_dir(settings)
        card = _card(target)
    if card is None:
        log.warning(
            "no --model given and no demo model shipped here: training the demo model (the tiny colours "
            "model, %s) into %s; a few minutes on two cores, once",
            DEMO_FAMILY, target,
        )
        _generate(target, _train_colours, lambda: _card(target) is not None)
        card = _card(target)
    from server.models.colours import DEFAULT_WINDOW as window

    log.warning(
        "serving the DEMO model at %s: a tiny model trained to see one thing, the screen's colour (%s). "
        "Ask 'What colour is the screen?' or watch 'Is the screen red?' (held-out accuracy on prompts of "
        "%d frames: naming %.2f, yes/no %.2f); anything else gets noise. To serve a real model: livesight "
        "serve --model Qwen/Qwen2.5-VL-3B-Instruct (or a local path, e.g. a SmolVLM checkpoint)",
        target, ", ".join(card.colour_token_ids), window, card.accuracy.get(f"naming_{window}_frames", 0.0),
        card.accuracy.get(f"yes_no_{window}_frames", 0.0),
    )
    return str(target)


def declared_prompt_frames(model_path: str) -> int | None:
    """The most frames a prompt of the model at ``model_path`` should hold, where its card says
    (the colours models: the longest prompt they are measured right at); None for any other model."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    try:
        card = _read_card(path)
    except ValueError:
        return None
    return card.max_prompt_frames if card is not None else None


def resolve_random_model(settings: Settings) -> str:
    """The random-weight model's path, generated (in seconds) if missing."""
    from server.models.tiny import is_demo_model, make_tiny_model

    target = random_model_dir(settings)
    _generate(target, lambda out: make_tiny_model(out, family=DEMO_FAMILY), lambda: is_demo_model(target))
    return str(target)


def _card(target: Path):
    """The colours card at ``target``, or None where there is no usable demo model there (none,
    a broken one, or one of an older version)."""
    try:
        card = _read_card(target)
    except ValueError:
        log.warning("the demo model at %s is broken: it will not be used", target)
        return None
    if card is None or not card.current:
        return None
    return card


def _read_card(target: Path):
    from server.models.colours import read_colours_card

    return read_colours_card(target)


def _train_colours(out: Path) -> None:
    from server.models.colours import make_colours_model

    make_colours_model(out, family=DEMO_FAMILY, seed=DEMO_SEED)


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
