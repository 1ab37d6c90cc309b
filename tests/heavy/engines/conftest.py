"""The engine tests' own model: a tiny Idefics3, the family vLLM loads natively."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def idefics3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Idefics3 (SmolVLM's family): the model vLLM loads natively, no torchvision needed."""
    from server.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-idefics3"), family="idefics3")
