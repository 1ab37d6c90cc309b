"""The transformers engine's check: yes or no from the next token, read on the session's warm
cache and not kept.

The model (``yes_no_model``) is a sharp tiny model of each family with yes and no tokens that
top its distributions, so a check's probability moves from prompt to prompt and a cache or
position mistake changes it. The reference never touches the engine: transformers' own forward
over the processor's encoding of the whole prompt. "As without the check" is measured on a twin
session that went through the same prefills and answers with no checks. The remote engine's
reading of a server's log probabilities is pinned here too, on a mock server (against vLLM's
own server: test_engine_check_vllm.py).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import torch

from server.engines.base import ChatTurn, CheckResult, EngineError, Prompt, TextSegment
from server.engines.hf_loading import load_model, load_processor
from server.engines.openai import OpenAIEngine
from server.engines.prompt_encoding import Piece
from server.engines.transformers_engine import TransformersEngine
from server.engines.yes_no import answer_token_ids, yes_probability
from tests.socket.engines.test_engine_cache import FRAMES, Answer, Reference, ask, prompt_for
from tests.socket.engines.yes_no_model import make_yes_no_model

pytestmark = pytest.mark.anyio

FAMILIES = ("qwen2_5_vl", "idefics3")
RED = "Is the screen red? Answer yes or no."
DOOR = "Is someone at the door? Answer yes or no."
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the whole module, so the module's engines can be shared."""
    return "asyncio"


@dataclass
class Rig:
    """One family's yes/no model: a started engine and the transformers reference."""

    family: str
    path: Path
    engine: TransformersEngine
    reference: Reference
    yes_ids: list[int]
    no_ids: list[int]

    @torch.inference_mode()
    def probability(self, prompt: Prompt) -> float:
        """P(yes) / (P(yes) + P(no)) after the whole prompt, computed from scratch by transformers."""
        logits = self.reference.model(**self.reference.inputs(prompt)).logits[0, -1]
        probs = torch.softmax(logits.float(), dim=-1)
        return yes_probability(float(probs[self.yes_ids].sum()), float(probs[self.no_ids].sum()))

    async def check(self, session: str, *prompts: Prompt) -> list[CheckResult]:
        return await self.engine.check(session, f"check-{time.monotonic_ns()}", list(prompts))


@pytest.fixture(scope="module", params=FAMILIES)
async def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    """The yes/no model of each family with an engine and an independent reference."""
    family = request.param
    path = make_yes_no_model(tmp_path_factory.mktemp(f"yes-no-{family}"), family)
    engine = TransformersEngine(str(path))
    await engine.start()
    processor = load_processor(str(path))
    yes, no = answer_token_ids(processor.tokenizer)
    yield Rig(family, path, engine, Reference(family, processor, load_model(str(path))), list(yes), list(no))
    await engine.close()


async def warm(rig: Rig, session: str, count: int) -> int:
    """Frames 1..count arrive one by one and the warm prefix follows each; returns its length."""
    cached = 0
    for n in range(1, count + 1):
        cached = await rig.engine.prefill(session, prompt_for(FRAMES[:n]))
    return cached


async def test_probability_equals_a_full_recompute(rig: Rig) -> None:
    """A check on a warm session gives a probability in [0, 1] equal (1e-4) to a fresh session's and to
    transformers' full recompute, and reports the warm prefix as its cached tokens."""
    assert rig.engine.capabilities.token_probabilities
    prefix = await warm(rig, "equal", 3)
    values = []
    for question in (RED, DOOR):
        prompt = prompt_for(FRAMES[:3], question)
        [warm_result] = await rig.check("equal", prompt)
        [cold_result] = await rig.check(f"fresh-{question}", prompt)
        expected = rig.probability(prompt)
        assert 0.0 <= warm_result.probability <= 1.0
        assert warm_result.probability == pytest.approx(expected, abs=TOLERANCE)
        assert cold_result.probability == pytest.approx(expected, abs=TOLERANCE)
        prompt_tokens = int(rig.reference.inputs(prompt)["input_ids"].shape[1])
        assert warm_result.prompt_tokens == cold_result.prompt_tokens == prompt_tokens
        assert warm_result.cached_tokens == prefix and cold_result.cached_tokens == 0
        values.append(expected)
    assert abs(values[0] - values[1]) > 1e-3  # the question matters: the comparison means something


async def test_the_cache_is_as_without_the_check(rig: Rig) -> None:
    """Checks between prefills and answers (also on a cache holding an answer's tokens) leave the
    next answers' greedy tokens and cached tokens what a session without checks gets."""
    plain: list[Answer] = []
    checked: list[Answer] = []
    follow_up_checks = []
    for session, answers, with_checks in (("plain", plain, False), ("checked", checked, True)):
        await warm(rig, session, 2)
        if with_checks:
            await rig.check(session, prompt_for(FRAMES[:2], RED), prompt_for(FRAMES[:2], DOOR))
        answers.append(await ask(rig.engine, session, prompt_for(FRAMES[:2], "What is there?")))
        if with_checks:  # the cache now holds the answer's tokens past the shared prefix
            follow_up_checks = await rig.check(session, prompt_for(FRAMES[:2], RED))
        answers.append(await ask(rig.engine, session, prompt_for(FRAMES[:2], "What is there?")))
        await rig.engine.prefill(session, prompt_for(FRAMES[:3]))
        if with_checks:
            await rig.check(session, prompt_for(FRAMES[:3], DOOR))
        answers.append(await ask(rig.engine, session, prompt_for(FRAMES[:3], "And now?")))
    for without, with_check in zip(plain, checked):
        assert with_check.tokens == without.tokens
        assert with_check.usage == without.usage
    assert checked[1].usage.cached_tokens >= checked[1].usage.prompt_tokens - 1  # the answer stayed cached
    [follow_up] = follow_up_checks
    assert follow_up.probability == pytest.approx(rig.probability(prompt_for(FRAMES[:2], RED)), abs=TOLERANCE)


async def test_prompts_in_one_call_equal_one_at_a_time(rig: Rig) -> None:
    """Two watches of one session checked in one call (one model step, side by side) give what each
    gives alone, to float rounding (1e-4, as against a full recompute), with the same token counts."""
    await warm(rig, "together", 2)
    await warm(rig, "alone", 2)
    prompts = [prompt_for(FRAMES[:2], RED), prompt_for(FRAMES[:2], DOOR)]
    together = await rig.check("together", *prompts)
    alone = [(await rig.check("alone", prompt))[0] for prompt in prompts]
    assert len(together) == 2
    for both, one, prompt in zip(together, alone, prompts):
        assert both.probability == pytest.approx(one.probability, abs=TOLERANCE)
        assert both.probability == pytest.approx(rig.probability(prompt), abs=TOLERANCE)
        assert (both.prompt_tokens, both.cached_tokens) == (one.prompt_tokens, one.cached_tokens)
    assert abs(together[0].probability - together[1].probability) > 1e-3  # each read its own question


async def test_a_sessions_watches_are_one_model_step(rig: Rig) -> None:
    """On a warm session, three watches in one call run as one model step, also where the cache holds
    an answer past the shared prefix; each gives what a full recompute gives."""
    engine = await _engine(rig)
    steps: list[int] = []
    check_step = engine._check_step

    def counting(session_id: str, prompts: list[list[Piece]]) -> Any:
        steps.append(len(prompts))
        return check_step(session_id, prompts)

    engine._check_step = counting  # type: ignore[method-assign]
    try:
        for n in (1, 2):
            await engine.prefill("batched", prompt_for(FRAMES[:n]))
        prompts = [prompt_for(FRAMES[:2], q) for q in (RED, DOOR, "Is it dark? Answer yes or no.")]
        first = await engine.check("batched", "watches", prompts)
        await ask(engine, "batched", prompt_for(FRAMES[:2], "What is there?"))
        second = await engine.check("batched", "watches", prompts)
        assert steps == [3, 3]
        for prompt, a, b in zip(prompts, first, second):
            expected = rig.probability(prompt)
            assert a.probability == pytest.approx(expected, abs=TOLERANCE)
            assert b.probability == pytest.approx(expected, abs=TOLERANCE)
            assert 0 < a.cached_tokens <= b.cached_tokens < b.prompt_tokens
    finally:
        await engine.close()


async def test_a_round_before_the_warm_prefix_warms_its_new_frame_once(rig: Rig) -> None:
    """Watches checked on a frame the warm prefix has not taken yet (a busy model: the round went
    first) compute that frame once, for every prompt, and keep it: each probability is a full
    recompute's, the prefix's prefill of the frame then computes no image token, and the session
    answers what a session that warmed the frame before its checks answers."""
    prompts = [prompt_for(FRAMES[:3], q) for q in (RED, DOOR)]
    answers = []
    for session in ("round-first", "prefix-first"):
        await warm(rig, session, 2)
        before = dict(rig.engine.stats()["prompt_tokens_computed"])
        if session == "round-first":
            checked = await rig.check(session, *prompts)
            for prompt, result in zip(prompts, checked, strict=True):
                assert result.probability == pytest.approx(rig.probability(prompt), abs=TOLERANCE)
            after_round = dict(rig.engine.stats()["prompt_tokens_computed"])
            await rig.engine.prefill(session, prompt_for(FRAMES[:3]))
            computed = rig.engine.stats()["prompt_tokens_computed"]
            frame_tokens = after_round["warm"] - before.get("warm", 0)
            assert frame_tokens > 0, "the round kept no frame"
            assert computed["warm"] - after_round["warm"] < frame_tokens / 2, "the frame was computed again"
        else:
            await rig.engine.prefill(session, prompt_for(FRAMES[:3]))
            await rig.check(session, *prompts)
        answers.append(await ask(rig.engine, session, prompt_for(FRAMES[:3], "And now?")))
    fused, plain = answers
    assert fused.tokens == plain.tokens and fused.usage == plain.usage


async def test_cancelled_check_leaves_the_cache_intact(rig: Rig) -> None:
    """A check of three prompts in three model steps (a step of one token at most, so one prompt a
    step) cancelled after its first step stops there, and the session answers as if no check had run."""
    engine = await _engine(rig, prefill_chunk_tokens=1)
    steps: list[int] = []
    first_step = anyio.Event()
    check_step = engine._check_step
    loop = anyio.lowlevel.current_token()

    def counting(session_id: str, prompts: list[list[Piece]]) -> Any:
        steps.append(len(prompts))
        result = check_step(session_id, prompts)
        anyio.from_thread.run_sync(first_step.set, token=loop)  # from the model thread
        return result

    engine._check_step = counting  # type: ignore[method-assign]
    try:
        for session in ("cut", "uncut"):
            for n in (1, 2):
                await engine.prefill(session, prompt_for(FRAMES[:n]))
        prompts = [prompt_for(FRAMES[:2], q) for q in (RED, DOOR, "Is it dark? Answer yes or no.")]
        async with anyio.create_task_group() as group:
            group.start_soon(engine.check, "cut", "cancelled", prompts)
            await first_step.wait()
            group.cancel_scope.cancel()
        assert steps == [1]
        query = prompt_for(FRAMES[:2], "What is there?")
        cut, uncut = await ask(engine, "cut", query), await ask(engine, "uncut", query)
        assert cut.tokens == uncut.tokens and cut.usage == uncut.usage
        assert cut.usage.cached_tokens > 0
    finally:
        await engine.close()


async def test_an_open_turn_is_no_check(rig: Rig) -> None:
    """A warm prefix (open turn) is refused as a check with EngineError, and nothing is cached by it."""
    with pytest.raises(EngineError):
        await rig.check("open", prompt_for(FRAMES[:1]))
    assert (await ask(rig.engine, "open", prompt_for(FRAMES[:1], "Hi?"))).usage.cached_tokens == 0


async def test_a_check_costs_its_question_not_a_frame(rig: Rig) -> None:
    """On a warm session a check runs only its question's tokens: printed, its time against a
    prefill of one more frame (medians of five)."""
    engine = await _engine(rig)
    try:
        frame_s, check_s = [], []
        for round_ in range(5):
            session = f"timed-{round_}"
            for n in (1, 2):
                started = time.perf_counter()
                await engine.prefill(session, prompt_for(FRAMES[:n]))
            frame_s.append(time.perf_counter() - started)  # the second frame alone
            started = time.perf_counter()
            [result] = await engine.check(session, "timed", [prompt_for(FRAMES[:2], RED)])
            check_s.append(time.perf_counter() - started)
            question_tokens = result.prompt_tokens - result.cached_tokens
            assert 0 < question_tokens < 40
        frame_ms, check_ms = 1000 * statistics.median(frame_s), 1000 * statistics.median(check_s)
        print(f"\n{rig.family}: check {check_ms:.1f} ms ({question_tokens} tokens run) against a one-frame "
              f"prefill {frame_ms:.1f} ms")
    finally:
        await engine.close()


async def _engine(rig: Rig, **options: Any) -> TransformersEngine:
    """An engine of the test's own on the rig's model (one whose steps a test may wrap)."""
    engine = TransformersEngine(str(rig.path), **options)
    await engine.start()
    return engine


# ---------------------------------------------------------------------- the remote engine's reading


def _remote(answers: dict[str, dict], seen: list[dict]) -> OpenAIEngine:
    """A remote engine on a mock server that answers each check by its question's last word."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        seen.append({**body, "request_id": request.headers.get("x-request-id")})
        question = body["messages"][-1]["content"]
        return httpx.Response(200, json=answers[question.split()[-1]])

    return OpenAIEngine(["http://srv:8000"], model="m", transport=httpx.MockTransport(handler))


def _chat_answer(tops: list[tuple[str, float]] | None) -> dict:
    logprobs = None if tops is None else {
        "content": [{"token": tops[0][0], "logprob": tops[0][1],
                     "top_logprobs": [{"token": t, "logprob": lp} for t, lp in tops]}]
    }
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "logprobs": logprobs}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 256}},
    }


def _question(word: str) -> Prompt:
    return Prompt((ChatTurn("system", (TextSegment("You watch."),)), ChatTurn("user", (TextSegment(f"Is it {word}"),))))


async def test_remote_check_reads_the_top_logprobs() -> None:
    """The remote engine asks for one token and its top 20 log probabilities, and reads yes and no
    words among them (any case, any spaces); two prompts go at once, each with its own request id."""
    answers = {
        "red?": _chat_answer([(" Yes", math.log(0.5)), ("no", math.log(0.2)), ("yes", math.log(0.1)), ("the", -1.0)]),
        "green?": _chat_answer([("the", -0.1), ("a", -3.0)]),  # neither word among the top ones
    }
    seen: list[dict] = []
    engine = _remote(answers, seen)
    await engine.start()
    try:
        assert engine.capabilities.token_probabilities
        red, green = await engine.check("s", "watch", [_question("red?"), _question("green?")])
    finally:
        await engine.close()
    assert red == CheckResult(pytest.approx(0.6 / 0.8), 300, 256)
    assert green.probability == 0.5
    assert sorted(b["request_id"] for b in seen) == ["watch-0", "watch-1"]
    for body in seen:
        assert (body["max_tokens"], body["logprobs"], body["top_logprobs"], body["stream"]) == (1, True, 20, False)


async def test_remote_check_without_logprobs_is_an_engine_error() -> None:
    """A server that returns no log probabilities fails the check with EngineError."""
    engine = _remote({"red?": _chat_answer(None)}, [])
    await engine.start()
    try:
        with pytest.raises(EngineError, match="no token probabilities"):
            await engine.check("s", "watch", [_question("red?")])
    finally:
        await engine.close()
