"""What ``livesight serve`` serves with no ``--model``: the colours model livesight ships, served
at once with no training (a warning says what it knows), right about colours through the real
server at the server's defaults: a newcomer's first answer is the screen's colour, a whole
window of frames later too, and a red watch fires on red scenes only. The benchmarks'
random-weight model is generated beside it, and a half-written one is replaced; the demo model
is trained into the cache only where no current shipped one is found.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from server.background import serve_process
from server.bench.demo import stream_demo
from server.models import demo
from server.models.colour_frames import COLOURS, ColourScene
from server.models.colours import MAX_PROMPT_FRAMES, read_colours_card
from server.models.demo import (
    DEMO_FAMILY, declared_prompt_frames, demo_model_dir, random_model_dir, resolve_model, resolve_random_model,
    shipped_model_dir,
)
from server.models.tiny import DEMO_MARKER, is_demo_model
from server.settings import Settings
from tests.colours_models import ShippedModels
from tests.protocol_client import Client, b64

pytestmark = pytest.mark.anyio


def test_serve_without_a_model_serves_the_shipped_demo_model(
    colours_models: ShippedModels, tmp_path: Path, caplog
) -> None:
    """With no model and an empty cache, the demo model is the shipped colours model: nothing is
    trained or written, and a warning names what it knows and its accuracy; a given model wins."""
    shipped = colours_models.get(DEMO_FAMILY)
    with caplog.at_level("WARNING", logger="livesight.server"):
        path = resolve_model(Settings(cache_dir=tmp_path))
    assert Path(path) == shipped.path == shipped_model_dir()
    assert list(tmp_path.iterdir()) == []
    assert "training" not in caplog.text and "serving the DEMO model" in caplog.text
    assert all(c in caplog.text for c in COLOURS)
    assert declared_prompt_frames(path) == MAX_PROMPT_FRAMES
    assert declared_prompt_frames(str(tmp_path)) is None
    assert resolve_model(Settings(cache_dir=tmp_path, model="some/model")) == "some/model"


def test_a_stale_shipped_model_gives_way_to_the_cached_one(
    colours_models: ShippedModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipped model of another recipe version is not served: the demo model in the cache is
    (here put there beforehand, so nothing is trained)."""
    shipped = colours_models.get(DEMO_FAMILY)
    stale = tmp_path / "shipped" / f"colours-{DEMO_FAMILY}"
    shutil.copytree(shipped.path, stale)
    marker = (stale / DEMO_MARKER).read_text(encoding="utf-8")
    (stale / DEMO_MARKER).write_text(marker.replace('"version": ', '"version": 1000'), encoding="utf-8")
    monkeypatch.setattr(demo, "SHIPPED_DIR", tmp_path / "shipped")
    settings = Settings(cache_dir=tmp_path / "cache")
    shutil.copytree(shipped.path, demo_model_dir(settings))
    assert Path(resolve_model(settings)) == demo_model_dir(settings)


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


async def test_livesight_serve_without_a_model_names_the_screens_colour(tmp_path: Path) -> None:
    """``livesight serve`` with no model and an empty cache: frames of a red, then a blue, then a
    green screen, and "What colour is the screen?" after each is answered with that colour; a
    session asking for more frames than the model handles gets its longest prompt, with a note."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LIVESIGHT_CACHE_DIR": str(tmp_path)}
    env.pop("LIVESIGHT_MODEL", None)
    scene = ColourScene(np.random.default_rng(5), (640, 480))
    with serve_process(["--log-level", "warning"], env=env, log_path=tmp_path / "serve.log") as served:
        client, opened = await Client.open(served.ws_url, {"sampling": {"max_tokens": 4}, "max_frames": 256},
                                           open_timeout=120)
        ready = opened.data
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
        log = served.log()
    assert said == ["red", "blue", "green"]
    assert ready["config"]["max_frames"] == MAX_PROMPT_FRAMES
    assert any(str(MAX_PROMPT_FRAMES) in note for note in ready.get("notes", [])), ready
    assert "serving the DEMO model" in log and "training" not in log
    assert list(p.name for p in tmp_path.iterdir()) == ["serve.log"]  # nothing trained into the cache


async def test_the_demo_model_is_right_at_the_servers_defaults(colours_models: ShippedModels) -> None:
    """One session with the default config and a red alert watch, a camera whose screen changes
    colour every 10 s at 2 fps (sent 3 times faster than real time), "What colour is the screen?" every 3 s for 80 s of stream, past the 50-frame window: at least 95% of the answers name the
    newest frame's colour, the watch fires in every red scene and never on another colour."""
    with serve_process(["--log-level", "warning", "--model", str(colours_models.get(DEMO_FAMILY).path)]) as served:
        run = await stream_demo(served.ws_url, seconds=80, fps=2, scene_s=10, ask_every_s=3, speed=3)
    assert len(run.asked) == 26 and len(run.statuses) == len(run.asked), run
    assert run.right >= 0.95 * len(run.asked), run.wrong()
    assert run.false_fires == [], run.fires
    assert run.scenes_fired() == len(run.red_scenes()) == 4, run.fires
