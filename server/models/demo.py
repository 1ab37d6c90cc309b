"""The demo model served when no model is configured: generated once, never downloaded."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from server.settings import Settings

log = logging.getLogger("livesight.server")
DEMO_FAMILY = "qwen2_5_vl"
DEMO_VERSION = "1"


def resolve_model(settings: Settings) -> str:
    """The model path to load: ``settings.model`` or the (generated) demo model."""
    if settings.model:
        return settings.model
    target = settings.cache_dir / f"demo-{DEMO_FAMILY}-v{DEMO_VERSION}"
    if not (target / "livesight_demo.json").exists():
        from server.models.tiny import make_tiny_model

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
        make_tiny_model(tmp, family=DEMO_FAMILY)
        try:
            os.replace(tmp, target)  # atomic: a half-written model is never used
        except OSError:
            if not (target / "livesight_demo.json").exists():
                raise
    log.warning(
        "serving the generated DEMO model at %s: it has random weights, so its answers are noise. "
        "To serve a real model: livesight serve --model Qwen/Qwen2.5-VL-3B-Instruct "
        "(or a local path, e.g. a SmolVLM checkpoint)",
        target,
    )
    return str(target)
