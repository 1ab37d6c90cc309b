"""Inference engines behind one interface (``base.Engine``)."""

from __future__ import annotations

from server.engines.base import Engine
from server.settings import Settings


def create_engine(settings: Settings) -> Engine:
    """The engine named by ``settings.engine``, serving ``settings.model`` (or the demo model)."""
    from server.demo_model import resolve_model
    from server.engines.transformers_engine import TransformersEngine

    return TransformersEngine(
        resolve_model(settings),
        device=settings.device,
        dtype=settings.dtype,
        trust_remote_code=settings.trust_remote_code,
        max_cached_tokens=settings.max_cached_tokens,
        max_image_side=settings.max_image_side,
        max_cached_images=settings.max_cached_images,
    )
