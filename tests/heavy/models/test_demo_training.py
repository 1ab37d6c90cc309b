"""The demo model livesight ships is what its recipe makes: ``livesight make-tiny-model DIR
--task colours --retrace`` (run in the background from the start of the test run,
tests/colours_models.py) trains the recipe again as far as the fingerprints the shipped card
records and finds the same weights there; the shipped weights file is the one that training,
run to its end, wrote; a fingerprint tells a one-ulp change of one weight."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from server.models.colours import WEIGHTS_FILE, file_sha256, read_colours_card, weights_fingerprint
from server.models.demo import DEMO_FAMILY, shipped_model_dir
from server.models.tiny import DEMO_MARKER, TinyShape, build_tiny_model
from tests.colours_models import TRAIN_TIMEOUT_S, Retraced

pytestmark = pytest.mark.timeout(TRAIN_TIMEOUT_S + 60)


def test_the_recipe_retraces_the_shipped_demo_model(demo_training: Retraced) -> None:
    """Trained again with the shipped card's seed, the recipe's weights after its short prompts and
    a few steps into its session prompts are bit for bit the ones the shipped card recorded
    when it trained the model to its end; it said how training went while it ran."""
    card = read_colours_card(shipped_model_dir(DEMO_FAMILY))
    assert card is not None and card.current and len(card.fingerprints) == 2, card
    shipped = shipped_model_dir(DEMO_FAMILY)
    recorded = json.loads((shipped / DEMO_MARKER).read_text(encoding="utf-8"))["training"]["weights_sha256"]
    assert file_sha256(shipped / WEIGHTS_FILE) == recorded, "the shipped weights are not the ones training wrote"
    assert demo_training.code == 0, demo_training.log[-3000:]
    assert "the recipe makes the colours model" in demo_training.log
    assert "validation accuracy" in demo_training.log and "steps on session prompts" in demo_training.log
    print(f"demo model's training retraced in {demo_training.seconds:.0f} s: {sorted(card.fingerprints)} match")


def test_a_fingerprint_tells_one_ulp() -> None:
    """Two builds of a model with one seed share a fingerprint; one weight moved by one ulp does not."""
    shape = TinyShape(vocab=300, qwen_min_tokens=4, qwen_max_tokens=12, idefics3_image=64)
    model, _ = build_tiny_model("qwen2_5_vl", shape, seed=3)
    again, _ = build_tiny_model("qwen2_5_vl", shape, seed=3)
    assert weights_fingerprint(model) == weights_fingerprint(again)
    weight = next(p for p in again.parameters() if p.numel() > 1)
    with torch.no_grad():
        weight.view(-1)[0] = torch.nextafter(weight.view(-1)[0], torch.tensor(float("inf")))
    assert weights_fingerprint(model) != weights_fingerprint(again)


@pytest.mark.parametrize("damage", ["no fingerprints", "another recipe version"])
def test_retrace_refuses_a_card_it_cannot_check(damage: str, tmp_path: Path) -> None:
    """--retrace on a colours model whose card has no fingerprints, or of another recipe
    version, exits with 1 and says why, before any training."""
    model = tmp_path / "model"
    shutil.copytree(shipped_model_dir(DEMO_FAMILY), model)
    marker = json.loads((model / DEMO_MARKER).read_text(encoding="utf-8"))
    if damage == "no fingerprints":
        del marker["training"]["fingerprints"]
    else:
        marker["version"] -= 1
    (model / DEMO_MARKER).write_text(json.dumps(marker), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "server.cli", "make-tiny-model", str(model), "--task", "colours",
                           "--retrace"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "no current colours model with fingerprints" in done.stderr, done.stderr
