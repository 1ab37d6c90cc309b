"""The demo model livesight ships is what its recipe makes: ``livesight make-tiny-model DIR
--task colours`` (run in the background from the start of the test run, tests/colours_models.py)
trains the same weights, with the progress it prints and the card it writes."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from server.models.colours import read_colours_card
from server.models.demo import DEMO_FAMILY, shipped_model_dir
from server.models.tiny import DEMO_MARKER
from tests.colours_models import TRAIN_TIMEOUT_S, Trained

pytestmark = pytest.mark.timeout(TRAIN_TIMEOUT_S + 60)

#: What may differ between two trainings' cards: how long they took.
TIMING = ("seconds",)


def test_training_reproduces_the_shipped_demo_model(demo_training: Trained) -> None:
    """Trained again with the same seed, the demo model has exactly the shipped weights and card
    (but for the training's seconds), and said how training went while it ran."""
    shipped = shipped_model_dir(DEMO_FAMILY)
    trained = load_file(str(demo_training.path / "model.safetensors"))
    expected = load_file(str(shipped / "model.safetensors"))
    assert trained.keys() == expected.keys()
    differ = [name for name in expected if not bool((trained[name] == expected[name]).all())]
    assert not differ, f"{len(differ)} of {len(expected)} tensors differ from the shipped model's, e.g. {differ[:5]}"
    card, shipped_card = (json.loads((d / DEMO_MARKER).read_text(encoding="utf-8")) for d in (demo_training.path, shipped))
    for key in TIMING:
        card["training"].pop(key), shipped_card["training"].pop(key)
    assert card == shipped_card
    assert read_colours_card(demo_training.path).current
    assert "validation accuracy" in demo_training.log and "steps on session prompts" in demo_training.log
    print(f"demo model trained again in {demo_training.train_s:.0f} s, the same weights")
