"""What ``livesight serve`` serves with no ``--model``: the colours model, trained here the first
time (with a progress line and a warning that says what it knows), reused after that, and
right about colours through the real server: a newcomer's first answer is the screen's colour.
The benchmarks' random-weight model is generated beside it, and a half-written one is replaced.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from server.background import serve_process
from server.models.colour_frames import COLOURS, ColourScene
from server.models.colours import read_colours_card
from server.models.demo import (
    DEMO_FAMILY, demo_model_dir, random_model_dir, resolve_model, resolve_random_model,
)
from server.models.tiny import DEMO_MARKER, is_demo_model
from server.settings import Settings
from tests.colours_models import ColoursModels
from tests.protocol_client import Client, b64

pytestmark = pytest.mark.anyio


def test_serve_without_a_model_trains_the_colours_model_once(colours_models: ColoursModels, caplog) -> None:
    """With no model and an empty cache, the demo model is the colours model, trained into the
    cache with a line saying so and a warning naming what it knows and its accuracy; asked again,
    it is found, not trained (in a small fraction of the training time, the directory untouched)."""
    trained = colours_models.get(DEMO_FAMILY)
    settings = Settings(cache_dir=colours_models.cache_dir())
    assert trained.path == demo_model_dir(settings)
    assert "training the demo model" in trained.log
    assert "serving the generated DEMO model" in trained.log and all(c in trained.log for c in COLOURS)
    card = read_colours_card(trained.path)
    assert card is not None and card.family == DEMO_FAMILY
    assert card.accuracy["yes_no"] >= 0.95 and card.accuracy["naming"] >= 0.95, card.accuracy
    before = os.stat(trained.path).st_ino, (trained.path / DEMO_MARKER).stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("WARNING", logger="livesight.server"):
        started = time.perf_counter()
        again = resolve_model(settings)
        found_s = time.perf_counter() - started
    assert Path(again) == trained.path
    assert (os.stat(trained.path).st_ino, (trained.path / DEMO_MARKER).stat().st_mtime_ns) == before
    assert "training" not in caplog.text and "serving the generated DEMO model" in caplog.text
    assert found_s < trained.train_s / 20
    assert resolve_model(Settings(cache_dir=colours_models.cache_dir(), model="some/model")) == "some/model"


def test_random_model_is_generated_beside_it_and_replaces_a_half_written_one(tmp_path: Path) -> None:
    """The benchmarks' random-weight model: generated in the cache, and a folder an interrupted
    run left (no marker) is replaced by a whole model."""
    settings = Settings(cache_dir=tmp_path)
    half = random_model_dir(settings)
    half.mkdir(parents=True)
    (half / "config.json").write_text("{", encoding="utf-8")
    path = Path(resolve_random_model(settings))
    assert path == half and is_demo_model(path) and read_colours_card(path) is None
    assert (path / "config.json").read_text(encoding="utf-8") != "{"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary folder left


async def test_livesight_serve_without_a_model_names_the_screens_colour(colours_models: ColoursModels) -> None:
    """``livesight serve`` with no model, on the cache the demo model was trained into: frames of a
    red, then a blue, then a green screen, and "What colour is the screen?" after each is
    answered with that colour."""
    colours_models.get(DEMO_FAMILY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LIVESIGHT_CACHE_DIR": str(colours_models.cache_dir())}
    env.pop("LIVESIGHT_MODEL", None)
    scene = ColourScene(np.random.default_rng(5), (640, 480))
    with serve_process(["--log-level", "warning"], env=env) as served:
        client, _ = await Client.open(served.ws_url, {"sampling": {"max_tokens": 4}}, open_timeout=120)
        said = []
        try:
            for t, colour in enumerate(("red", "blue", "green")):
                for k in range(2):
                    jpeg = scene.frame(colour, 2 * t + k, None).jpeg
                    await client.send(type="video.frame", data=b64(jpeg), frame_id=2 * t + k)
                    await client.recv_type("video.frame.ack")
                answer = await client.ask("What colour is the screen?")
                said.append("".join(e["delta"] for e in answer if e["type"] == "response.text.delta").strip())
        finally:
            await client.ws.close()
    assert said == ["red", "blue", "green"]
