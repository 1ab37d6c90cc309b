"""The transformers engine's warm KV cache gives exactly the greedy tokens of a full recompute.

The reference never touches our cache or position code: the whole prompt is rendered with
the processor's chat template, encoded by the processor in one call, and continued with
transformers' own ``model.generate(do_sample=False)`` on a separately loaded copy of the
model, so for Qwen2.5-VL the multimodal rotary positions come from transformers'
``get_rope_index``. The models are tiny and "sharp" (``init_std=0.3``): a position or cache
mistake changes their greedy tokens, which ``test_position_error_changes_tokens`` checks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from PIL import Image

from handlers.media.frame_image import FrameImage
from handlers.core.frames import Frame, content_key
from handlers.core.prompt import Exchange, build_prompt, render_timeline
from handlers.core.timeline import INTERRUPTED_MARK, Timeline, interrupted_answer
from server.engines import transformers_engine
from server.engines.base import ImageSegment, Prompt, Sampling, TextDelta, TextSegment, Usage
from server.engines.hf_loading import load_model, load_processor
from server.engines.prompt_encoding import Piece
from server.engines.transformers_engine import TransformersEngine
from server.models.tiny import make_tiny_model

pytestmark = pytest.mark.anyio

FAMILIES = ("qwen2_5_vl", "idefics3")
NEW_TOKENS = 16
GREEDY = Sampling(temperature=0.0, max_tokens=NEW_TOKENS)
SIZES = ((320, 240), (240, 320))  # landscape and portrait: Qwen grids 9x11 and 11x9


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the whole module, so the module's engines can be shared."""
    return "asyncio"


# ---------------------------------------------------------------------- frames and prompts


@dataclass(frozen=True)
class Shot:
    """A decoded camera picture; turned into a session ``Frame`` only while a prompt is built."""

    seq: int
    key: str
    image: np.ndarray  # as the server decodes it: H x W x 3 uint8 RGB


def make_shots(count: int) -> list[Shot]:
    """Different random pictures, alternating landscape and portrait."""
    shots = []
    for index in range(count):
        rng = np.random.default_rng(index)
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = np.array(Image.fromarray(small).resize(SIZES[index % 2], Image.BILINEAR))
        shots.append(Shot(index, content_key(image.tobytes()), image))
    return shots


FRAMES = make_shots(8)


def as_frame(shot: Shot) -> Frame:
    """The session's frame for ``shot``, 0.5 s after the previous one."""
    return Frame(seq=shot.seq, key=shot.key, data=None, receive_ts_ms=1e12 + 500 * shot.seq,
                 pts_ms=500.0 * shot.seq, image=FrameImage.decoded(shot.image))


def prompt_for(
    shots: Sequence[Shot], question: str | None = None, history: Sequence[Exchange] = ()
) -> Prompt:
    """The prompt the server builds: system, history, timestamped frames, question (none = warm prefix).

    The ``Frame`` objects live only inside this call: live frames outside a session would
    look like a leak to the other test modules' frame accounting.
    """
    return build_prompt(
        system_prompt=None, history=history, frames=[as_frame(shot) for shot in shots],
        origin=as_frame(FRAMES[0]), timestamps=True, question=question,
    )


# ---------------------------------------------------------------------- the reference


@dataclass
class Reference:
    """transformers alone: the processor and a separately loaded copy of the model."""

    family: str
    processor: Any
    model: Any

    def inputs(self, prompt: Prompt) -> dict[str, torch.Tensor]:
        """The processor's encoding of the whole prompt, in one call."""
        messages, images = [], []
        for turn in prompt.turns:
            content = []
            for segment in turn.segments:
                if isinstance(segment, TextSegment):
                    content.append({"type": "text", "text": segment.text})
                elif isinstance(segment, ImageSegment):
                    content.append({"type": "image"})
                    # A Pillow image: the engine's numpy frames must encode as these do.
                    images.append(Image.fromarray(segment.pixels()))
            messages.append({"role": turn.role, "content": content})
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not images:
            batch_images = None
        else:
            batch_images = images if self.family == "qwen2_5_vl" else [images]
        return self.processor(text=[text], images=batch_images, return_tensors="pt")

    @torch.inference_mode()
    def greedy(self, prompt: Prompt, new_tokens: int = NEW_TOKENS) -> list[int]:
        """transformers' own greedy continuation of the whole prompt, computed from scratch."""
        inputs = self.inputs(prompt)
        output = self.model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
        return output[0, inputs["input_ids"].shape[1] :].tolist()

    def text(self, tokens: list[int]) -> str:
        return self.processor.tokenizer.decode(tokens, skip_special_tokens=True)


@dataclass
class Rig:
    """One model family: its directory, a started engine and the transformers reference."""

    family: str
    path: Path
    engine: TransformersEngine
    reference: Reference

    async def engine_with(self, **options: Any) -> TransformersEngine:
        """Another engine on the same model, started (e.g. with a small cache budget)."""
        engine = TransformersEngine(str(self.path), **options)
        await engine.start()
        return engine


@pytest.fixture(scope="module", params=FAMILIES)
async def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    """A sharp tiny model of each family with an engine and an independent reference."""
    family = request.param
    path = make_tiny_model(tmp_path_factory.mktemp(f"sharp-{family}"), family=family, init_std=0.3)
    engine = TransformersEngine(str(path), kv_shift=False)  # exact: a slid window is cut back (kv_shift: below)
    await engine.start()
    reference = Reference(family, load_processor(str(path)), load_model(str(path)))
    yield Rig(family, path, engine, reference)
    await engine.close()


# ---------------------------------------------------------------------- asking the engine


@dataclass
class Answer:
    tokens: list[int]
    text: str
    usage: Usage


@contextmanager
def sampled_tokens() -> Iterator[list[int]]:
    """Record every token the engine picks: its text stream alone could hide a token swap."""
    tokens: list[int] = []
    pick = transformers_engine._sample

    def recording(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
        token = pick(logits, sampling, generator)
        tokens.append(token)
        return token

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers_engine, "_sample", recording)
        yield tokens


async def ask(engine: TransformersEngine, session_id: str, prompt: Prompt) -> Answer:
    """Run one greedy answer to the end."""
    with sampled_tokens() as tokens:
        text, usage = await ask_text(engine, session_id, prompt)
    return Answer(tokens, text, usage)


async def ask_text(engine: TransformersEngine, session_id: str, prompt: Prompt) -> tuple[str, Usage]:
    """Run one greedy answer to the end; returns its text and usage."""
    parts, usage = [], None
    async for event in engine.generate(session_id, f"req-{time.monotonic_ns()}", prompt, GREEDY):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            usage = event.usage
    assert usage is not None
    return "".join(parts), usage


def assert_matches(rig: Rig, answer: Answer, prompt: Prompt) -> list[int]:
    """The engine's answer is token for token transformers' full-recompute answer."""
    expected = rig.reference.greedy(prompt)
    assert answer.tokens == expected
    assert answer.text == rig.reference.text(expected)
    assert answer.usage.completion_tokens == len(expected)
    return expected


def token_count(rig: Rig, prompt: Prompt) -> int:
    """Tokens of a complete prompt, as the processor counts them."""
    assert not prompt.open_turn
    return int(rig.reference.inputs(prompt)["input_ids"].shape[1])


# ---------------------------------------------------------------------- tests


async def test_pieces_encode_like_the_processor(rig: Rig) -> None:
    """Our piecewise encoding (and Qwen's mrope positions) equal the processor's and get_rope_index's."""
    history = [Exchange("What is on the left?", "a red cup. naïve 😀")]
    for prompt in (prompt_for(FRAMES[:1], "Hi?"), prompt_for(FRAMES[:6], "What moved?", history)):
        pieces = rig.engine.encoder.encode(prompt)
        inputs = rig.reference.inputs(prompt)
        assert [i for piece in pieces for i in piece.ids] == inputs["input_ids"][0].tolist()
        if rig.family == "qwen2_5_vl":
            ours, _ = rig.engine.encoder.position_ids(pieces, 0)
            theirs, _ = rig.reference.model.model.get_rope_index(
                inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"]
            )
            assert torch.equal(ours, theirs)


async def test_frame_by_frame_growth(rig: Rig) -> None:
    """Prefilling 1..6 frames one by one, each query equals a full recompute and reuses the prefix."""
    session, prefilled = "growth", []
    for count in range(1, 7):
        cached = await rig.engine.prefill(session, prompt_for(FRAMES[:count]))
        prefilled.append(cached)
        query = prompt_for(FRAMES[:count], f"What changed in frame {count}?")
        answer = await ask(rig.engine, session, query)
        assert_matches(rig, answer, query)
        assert answer.usage.cached_tokens == cached  # the query pays only for its own words
        assert answer.usage.prompt_tokens == token_count(rig, query) > cached
    assert prefilled == sorted(set(prefilled))  # strictly growing


async def test_cold_and_chunked_prefill(rig: Rig) -> None:
    """A cold prompt, and one prefilled in chunks smaller than an image, equal a full recompute."""
    query = prompt_for(FRAMES[:6], "Describe the scene.")
    answer = await ask(rig.engine, "one-go", query)
    assert answer.usage.cached_tokens == 0
    expected = assert_matches(rig, answer, query)

    chunked = await rig.engine_with(prefill_chunk_tokens=37)
    try:
        await chunked.prefill("chunked", prompt_for(FRAMES[:3]))
        answer = await ask(chunked, "chunked", query)
    finally:
        await chunked.close()
    assert answer.tokens == expected and answer.usage.cached_tokens > 0


async def test_window_slide_cuts_the_cache_back(rig: Rig) -> None:
    """After a prefix of frames 1-6, a query over frames 4-8 is cut back and still exact."""
    session = "slide"
    first_frame = await rig.engine.prefill(session, prompt_for(FRAMES[:1]))
    for count in range(2, 7):
        await rig.engine.prefill(session, prompt_for(FRAMES[:count]))
    query = prompt_for(FRAMES[3:8], "What is in the last frame?")
    answer = await ask(rig.engine, session, query)
    assert_matches(rig, answer, query)
    # only the system prompt and the start of the user turn survive the cut
    assert 0 < answer.usage.cached_tokens < first_frame

    # the next warm prefix over the new window extends the cut-back cache, and stays exact
    cached = await rig.engine.prefill(session, prompt_for(FRAMES[3:8]))
    again = prompt_for(FRAMES[3:8], "And now?")
    answer = await ask(rig.engine, session, again)
    assert_matches(rig, answer, again)
    assert answer.usage.cached_tokens == cached


async def test_history_turns(rig: Rig) -> None:
    """Second and third turns, with earlier Q/A as text before the frames, equal a full recompute."""
    session, history = "history", []
    questions = ["What do you see?", "Is anything moving?", "What colour is the left side?"]
    for turn, question in enumerate(questions):
        frames = FRAMES[: 2 * turn + 2]
        for count in range(1, len(frames) + 1):
            cached = await rig.engine.prefill(session, prompt_for(frames[:count], history=history))
        query = prompt_for(frames, question, history)
        answer = await ask(rig.engine, session, query)
        assert_matches(rig, answer, query)
        assert answer.usage.cached_tokens == cached
        history = [*history, Exchange(question, answer.text)]


async def test_interrupted_turn_then_ask_again(rig: Rig) -> None:
    """Closing an answer after three deltas leaves a cache that answers the next query exactly."""
    session = "interrupted"
    prefix = await rig.engine.prefill(session, prompt_for(FRAMES[:4]))
    first = prompt_for(FRAMES[:4], "What is there?")
    stream = rig.engine.generate(session, "cut", first, GREEDY)
    deltas = 0
    async for event in stream:
        assert isinstance(event, TextDelta)
        deltas += 1
        if deltas == 3:
            break
    await stream.aclose()

    answer = await ask(rig.engine, session, first)
    assert_matches(rig, answer, first)
    assert answer.usage.cached_tokens >= answer.usage.prompt_tokens - 1

    other = prompt_for(FRAMES[:5], "What is new?")
    answer = await ask(rig.engine, session, other)
    assert_matches(rig, answer, other)
    assert answer.usage.cached_tokens == prefix


async def test_identical_prompt_twice(rig: Rig) -> None:
    """The same prompt twice: a full cache hit the second time, with the same tokens."""
    query = prompt_for(FRAMES[:3], "Count the objects.")
    first = await ask(rig.engine, "twice", query)
    second = await ask(rig.engine, "twice", query)
    expected = assert_matches(rig, first, query)
    assert second.tokens == expected
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= second.usage.prompt_tokens - 1 > 0


@pytest.mark.parametrize("error", ["off_by_one", "flat_positions"])
async def test_position_error_changes_tokens(rig: Rig, error: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the sharp model turns a position mistake into different greedy tokens."""
    # Plain-position models already use flat positions: there the "error" is no error, and
    # the answer must match (which shows the control detects exactly the mrope mistake).
    harmless = error == "flat_positions" and rig.family != "qwen2_5_vl"
    encoder = rig.engine.encoder
    correct = encoder.position_ids

    def wrong(pieces: list[Piece], start: int) -> tuple[torch.Tensor, int]:
        positions, next_position = correct(pieces, start)
        if error == "off_by_one":  # continuing a cache one position too far
            return (positions + 1, next_position + 1) if start > 0 else (positions, next_position)
        n = sum(len(piece.ids) for piece in pieces)  # text-style positions for images too
        flat = torch.arange(start, start + n)
        return (flat.unsqueeze(0) if harmless else flat.expand(3, 1, n)), start + n

    query = prompt_for(FRAMES[:4], "Where is the light?")
    session = f"control-{error}"
    monkeypatch.setattr(encoder, "position_ids", wrong)
    for count in range(1, 5):
        await rig.engine.prefill(session, prompt_for(FRAMES[:count]))
    answer = await ask(rig.engine, session, query)
    monkeypatch.undo()
    await rig.engine.release(session)

    if harmless:
        assert answer.tokens == rig.reference.greedy(query)
    else:
        assert answer.tokens != rig.reference.greedy(query)
    # and the same steps with correct positions match (the difference is the error alone)
    for count in range(1, 5):
        await rig.engine.prefill(session, prompt_for(FRAMES[:count]))
    assert_matches(rig, await ask(rig.engine, session, query), query)


async def test_budget_evicts_least_recently_used_session(rig: Rig) -> None:
    """Over a small token budget the idle LRU session is cleared, and later answers exactly again."""
    one_session = token_count(rig, prompt_for(FRAMES[:3], "Which?"))
    engine = await rig.engine_with(max_cached_tokens=int(one_session * 1.5))
    try:
        prompts = {
            "a": prompt_for(FRAMES[:3], "Which?"),
            "b": prompt_for(FRAMES[1:4], "Which?"),
        }
        await engine.prefill("a", prompt_for(FRAMES[:3]))
        await engine.prefill("b", prompt_for(FRAMES[1:4]))  # over budget: "a" is least recent
        assert engine.budget.evictions == 1

        answer_a = await ask(engine, "a", prompts["a"])
        assert answer_a.usage.cached_tokens == 0  # "a" was evicted: a full prefill
        assert_matches(rig, answer_a, prompts["a"])
        assert engine.budget.evictions == 2  # and now "b" made room for it

        answer_b = await ask(engine, "b", prompts["b"])
        assert answer_b.usage.cached_tokens == 0
        assert_matches(rig, answer_b, prompts["b"])
        assert engine.budget.total_tokens <= engine.budget.max_tokens
    finally:
        await engine.close()


async def test_budget_never_evicts_a_running_answer(rig: Rig) -> None:
    """Sessions answering at once over a small budget each still get the full-recompute answer."""
    # the answers interleave, so the shared token recorder cannot tell them apart: compare text
    prompts = {name: prompt_for(FRAMES[i : i + 3], "What is here?") for i, name in enumerate("abc")}
    one_session = token_count(rig, prompts["a"])
    engine = await rig.engine_with(max_cached_tokens=int(one_session * 1.5))
    texts: dict[str, tuple[str, Usage]] = {}

    async def answer(name: str) -> None:
        texts[name] = await ask_text(engine, name, prompts[name])

    try:
        async with anyio.create_task_group() as group:
            for name in prompts:
                group.start_soon(answer, name)
        assert engine.budget.evictions > 0  # the budget really was too small for all three
    finally:
        await engine.close()
    for name, prompt in prompts.items():
        expected = rig.reference.greedy(prompt)
        text, usage = texts[name]
        assert (text, usage.completion_tokens) == (rig.reference.text(expected), len(expected))


async def test_pixel_cache_of_one_image_still_answers_exactly(rig: Rig) -> None:
    """With room for one preprocessed image, evicted pixels are recomputed from the frame."""
    engine = await rig.engine_with(max_cached_images=1, max_cached_tokens=1)
    try:
        query = prompt_for(FRAMES[:3], "What changed?")
        for count in range(1, 4):
            await engine.prefill("p", prompt_for(FRAMES[:count]))
        assert_matches(rig, await ask(engine, "p", query), query)
        # a budget of one token drops the idle cache: the next answer re-prefills every image
        await engine.prefill("q", prompt_for(FRAMES[3:4]))
        again = await ask(engine, "p", query)
        assert again.usage.cached_tokens == 0
        assert_matches(rig, again, query)
    finally:
        await engine.close()


# ---------------------------------------------------------------------- the timeline, turn by turn


def timeline_prompt(timeline: Timeline, question: str | None = None) -> Prompt:
    """The server's prompt for ``timeline`` (none = the warm prefix), rendered as the session does."""
    return render_timeline(
        system_prompt=None, history=timeline.history, turns=timeline.turns, open_frames=timeline.open,
        origin=as_frame(FRAMES[0]), timestamps=True, question=question,
    )


def prompt_at(timeline: Timeline, turn_index: int) -> Prompt:
    """The query prompt that asked turn ``turn_index`` of ``timeline`` (its frames then question)."""
    index = turn_index % len(timeline.turns)
    earlier = Timeline(num_frames=timeline.num_frames, history=timeline.history, turns=timeline.turns[:index],
                       open=list(timeline.turns[index].frames))
    return timeline_prompt(earlier, timeline.turns[index].question)


async def warm_each_frame(rig: Rig, session: str, timeline: Timeline, frames: list[Frame]) -> int:
    """Frames arrive one by one; the warm prefix follows each. Returns the cached length."""
    cached = await rig.engine.prefill(session, timeline_prompt(timeline))
    for frame in frames:
        timeline.admit([frame])
        cached = await rig.engine.prefill(session, timeline_prompt(timeline))
    return cached


async def turn(rig: Rig, session: str, timeline: Timeline, question: str) -> Answer:
    """Ask, check against transformers' full recompute, and close the turn with the answer."""
    query = timeline_prompt(timeline, question)
    answer = await ask(rig.engine, session, query)
    assert_matches(rig, answer, query)
    assert answer.usage.prompt_tokens == token_count(rig, query)
    timeline.close_turn(question, answer.text)
    return answer


async def test_timeline_follow_ups_and_frames_between_turns(rig: Rig) -> None:
    """Follow-ups and frames arriving between turns: every answer equals a full recompute, and each
    question finds everything before the previous answer (and the warmed frames) cached."""
    session, timeline = "timeline", Timeline(num_frames=8)
    frames = [as_frame(shot) for shot in FRAMES[:6]]
    await warm_each_frame(rig, session, timeline, frames[:3])
    first = await turn(rig, session, timeline, "What do you see?")
    warm = await warm_each_frame(rig, session, timeline, [])  # the moment the answer ends
    follow = await turn(rig, session, timeline, "And on the left?")
    assert follow.usage.cached_tokens == warm >= first.usage.prompt_tokens
    warm = await warm_each_frame(rig, session, timeline, frames[3:5])  # new frames, then a question
    third = await turn(rig, session, timeline, "What is new?")
    assert third.usage.cached_tokens == warm >= follow.usage.prompt_tokens + 2 * 90
    before = [i for piece in rig.engine.encoder.encode(timeline_prompt(timeline)) for i in piece.ids]
    again = await turn(rig, session, timeline, "Anything else?")  # asked with no warmup at all
    # The answer's generated tokens stayed in the cache: it is cut only where the answer's text,
    # rendered again, stops giving the tokens that were generated (the last one was never fed).
    previous = [i for piece in rig.engine.encoder.encode(prompt_at(timeline, -2)) for i in piece.ids]
    kept = 0
    generated = third.tokens[:-1]
    rendered = before[len(previous) :]
    while kept < min(len(generated), len(rendered)) and rendered[kept] == generated[kept]:
        kept += 1
    assert again.usage.cached_tokens == len(previous) + kept
    assert [len(t.frames) for t in timeline.turns] == [3, 0, 2, 0]


async def test_timeline_interrupted_turn(rig: Rig) -> None:
    """An answer cut after three deltas stays in the timeline, marked; the next question is exact
    and reuses everything before the cut answer."""
    session, timeline = "timeline-cut", Timeline(num_frames=8)
    await warm_each_frame(rig, session, timeline, [as_frame(shot) for shot in FRAMES[:3]])
    query = timeline_prompt(timeline, "Describe it all.")
    stream = rig.engine.generate(session, "cut", query, GREEDY)
    parts = []
    async for event in stream:
        parts.append(event.text)
        if len(parts) == 3:
            break
    await stream.aclose()
    timeline.close_turn("Describe it all.", interrupted_answer("".join(parts)))
    prompt_tokens = token_count(rig, query)
    answer = await turn(rig, session, timeline, "Go on?")
    assert answer.usage.cached_tokens >= prompt_tokens
    assistant = [t for t in timeline_prompt(timeline).turns if t.role == "assistant"]
    assert assistant[0].segments[0].text.endswith(INTERRUPTED_MARK)


async def test_timeline_eviction_rewarms_and_keeps_the_talk(rig: Rig) -> None:
    """A bulk eviction folds the turns whose frames left into text; the re-warmed timeline answers
    exactly and the next question pays only for its own words."""
    session, timeline = "timeline-evict", Timeline(num_frames=8, max_history_tokens=1000)
    frames = [as_frame(shot) for shot in FRAMES[:7]]
    await warm_each_frame(rig, session, timeline, frames[:3])
    await turn(rig, session, timeline, "What is there?")
    await warm_each_frame(rig, session, timeline, frames[3:4])
    await turn(rig, session, timeline, "And now?")
    for frame in frames[:3]:  # the window drops its oldest part at once
        frame.in_window = False
    assert timeline.forget_evicted()
    assert [e.question for e in timeline.history] == ["What is there?"]
    warm = await warm_each_frame(rig, session, timeline, frames[4:7])
    answer = await turn(rig, session, timeline, "What happened?")
    assert answer.usage.cached_tokens == warm
    assert [t.role for t in timeline_prompt(timeline).turns][:3] == ["system", "user", "assistant"]


async def test_timeline_thinned_for_num_frames(rig: Rig) -> None:
    """num_frames=3 over 8 frames: the timeline is thinned (never more than 3 frames in a prompt),
    re-warmed, and still answers exactly with the newest frame in it."""
    session, timeline = "timeline-thin", Timeline(num_frames=3)
    frames = [as_frame(shot) for shot in FRAMES[:8]]
    for frame in frames[:7]:
        timeline.admit([frame])
        assert len(timeline.frames) <= 3
        cached = await rig.engine.prefill(session, timeline_prompt(timeline))
    assert timeline.stride > 1
    timeline.admit(frames, newest=frames[7])
    assert len(timeline.frames) <= 3 and timeline.frames[-1] is frames[7]
    query = timeline_prompt(timeline, "What moved?")
    answer = await ask(rig.engine, session, query)
    assert_matches(rig, answer, query)
    assert 0 < answer.usage.cached_tokens and cached > 0
    assert sum(isinstance(s, ImageSegment) for t in query.turns for s in t.segments) <= 3


async def test_cancelled_warmup_stops_within_one_frame(rig: Rig) -> None:
    """A warm prefill runs one frame per model step; cancelled after its first step it stops
    there, and a question continues exactly from what it cached."""
    engine = await rig.engine_with()
    steps: list[int] = []
    first_step = anyio.Event()
    forward = engine._forward
    loop = anyio.lowlevel.current_token()

    def counting(session_id: str, cache: Any, pieces: list[Piece], work: str | None = None) -> torch.Tensor:
        steps.append(sum(1 for piece in pieces if piece.image_key))
        out = forward(session_id, cache, pieces, work)
        anyio.from_thread.run_sync(first_step.set, token=loop)  # from the model thread
        return out

    engine._forward = counting  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(engine.prefill, "cut-warm", prompt_for(FRAMES[:6]))
            await first_step.wait()
            group.cancel_scope.cancel()
        assert steps and max(steps) <= 1 and len(steps) <= 2
        query = prompt_for(FRAMES[:6], "What is there?")
        answer = await ask(engine, "cut-warm", query)
        assert_matches(rig, answer, query)
        assert 0 < answer.usage.cached_tokens < answer.usage.prompt_tokens // 2
    finally:
        await engine.close()


async def test_usage_splits_prompt_into_image_audio_and_text_tokens(rig: Rig) -> None:
    """usage.image_tokens counts the processor's image token in the prompt's input ids and
    usage.audio_tokens the spoken words' tokens; the rest of prompt_tokens is text."""
    words = "What is on the table?"
    query = dataclasses.replace(prompt_for(FRAMES[:3], words), spoken=words)
    answer = await ask(rig.engine, "split", query)
    ids = rig.reference.inputs(query)["input_ids"][0]
    assert answer.usage.image_tokens == int((ids == rig.reference.processor.image_token_id).sum()) > 0
    spoken = rig.reference.processor.tokenizer(words, add_special_tokens=False)["input_ids"]
    assert answer.usage.audio_tokens == len(spoken) > 0
    assert answer.usage.image_tokens + answer.usage.audio_tokens < answer.usage.prompt_tokens == len(ids)
    plain = await ask(rig.engine, "split", prompt_for(FRAMES[:3], words))
    assert plain.usage.audio_tokens == 0 and plain.usage.image_tokens == answer.usage.image_tokens


@pytest.mark.parametrize("shape", [(240, 320), (3, 60), (1, 20)])
async def test_numpy_frames_encode_as_pillow_images(rig: Rig, shape: tuple[int, int]) -> None:
    """A decoded frame (numpy, H x W x 3) gets the processor's tokens and pixels of the same
    picture as a Pillow image, even 1 or 3 pixels tall (processors guess an array's layout)."""
    pixels = np.random.default_rng(7).integers(0, 256, (*shape, 3), dtype=np.uint8)
    encoder = rig.engine.encoder
    piece = encoder.image_piece(ImageSegment(content_key(pixels.tobytes()), pixels))
    picture = Image.fromarray(pixels)
    expected = rig.reference.processor(
        text=[encoder.family.processor_text],
        images=[picture] if encoder.family.mrope else [[picture]],
        return_tensors="pt",
        add_special_tokens=False,
    )
    assert list(piece.ids) == expected["input_ids"][0].tolist()
    assert torch.equal(encoder.pixel_inputs(piece)["pixel_values"], expected["pixel_values"])
