"""``livesight bench shift``: does a moved prefix answer like a cold prefill of the same window?

The embedded engine moves a session's warm prefix when frames leave its front (``kv_shift``):
the entries it keeps were computed while the evicted frames were still in the prompt. This
bench measures what that does to answers. Two engines on the same model run in this process:
one moves its prefix, one never does (``kv_shift=False``) and prefills every question's window
cold. A camera of colour scenes (``server.models.colour_frames``: a scene of ``scene`` frames
per colour in turn) streams into the moving engine one frame at a time through a window of
``window`` frames, so the prefix moves at every frame once the window is full; every
``ask_every`` frames after that the same question ("What colour is the screen?") and the same
check ("Is the screen red?") go to both engines over the same window. The same question asked
every ``ask_every`` frames while the window fills, before any move, is the baseline: how often
a warm prefix that was never moved agrees with a cold prefill (they differ only in the order
of float sums).

Printed: the questions, how many answers agree word for word (and the baseline's), the check probabilities'
differences (mean, p99, max), the smallest share of a question's prompt the moving engine's
cache served, and the moves done. On the colours model an answer names the screen's colour;
on the random-weight model (real frame sizes) an answer is noise, so agreement there says how
far the moved entries drift in a model whose outputs sit close together.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from server.bench.latency import percentile
from server.engines.base import ChatTurn, ImageSegment, Prompt, Sampling, TextDelta, TextSegment
from server.engines.transformers_engine import TransformersEngine

QUESTION = "What colour is the screen? Answer in one word."
CONDITION = "Is the screen red? Answer yes or no."
CAMERA = (320, 240)


def window_prompt(frames: list, first: int, question: str | None = None) -> Prompt:
    """The prompt over ``frames`` (the first of them frame number ``first``, two a second), open
    for more frames, or closed by ``question``."""
    from handlers.core.prompt import DEFAULT_SYSTEM_PROMPT

    segments: list = []
    for n, frame in enumerate(frames):
        segments += [TextSegment(f"[{(first + n) * 0.5:.1f}s]"), ImageSegment(frame.key, frame.pixels)]
    turns = (ChatTurn("system", (TextSegment(DEFAULT_SYSTEM_PROMPT),)),)
    if question is None:
        return Prompt(turns + (ChatTurn("user", tuple(segments)),), open_turn=True)
    return Prompt(turns + (ChatTurn("user", (*segments, TextSegment("\n" + question))),))


@dataclass
class Agreement:
    """The moving engine against cold prefills of the same windows."""

    answers: list[tuple[str, str]] = field(default_factory=list)  # (moved, cold) per question
    unmoved: list[tuple[str, str]] = field(default_factory=list)  # (warm, cold) before the first move
    probability_gaps: list[float] = field(default_factory=list)
    cached_shares: list[float] = field(default_factory=list)
    shifts: int = 0

    @property
    def agreed(self) -> int:
        return sum(moved == cold for moved, cold in self.answers)

    def report(self) -> list[str]:
        asked, gaps = len(self.answers), self.probability_gaps
        lines = [f"answers agreeing with a cold prefill: {self.agreed} of {asked} ({self.agreed / max(asked, 1):.1%})"]
        if self.unmoved:
            same = sum(warm == cold for warm, cold in self.unmoved)
            lines.append(f"baseline, the warm prefix before its first move against a cold prefill: {same} of "
                         f"{len(self.unmoved)} ({same / len(self.unmoved):.1%})")
        if gaps:
            lines.append(f"check P(yes) gap to the cold prefill: mean {statistics.mean(gaps):.4f}, p99 "
                         f"{percentile(gaps, 0.99):.4f}, max {max(gaps):.4f}")
        if self.cached_shares:
            lines.append(f"prompt cached at each question: lowest {min(self.cached_shares):.1%}; prefix moves {self.shifts}")
        disagreed = [pair for pair in self.answers if pair[0] != pair[1]]
        if disagreed:
            lines.append("first disagreements (moved / cold): " + ", ".join(f"{a!r}/{b!r}" for a, b in disagreed[:5]))
        return lines


async def _answer(engine: TransformersEngine, session: str, prompt: Prompt, max_tokens: int) -> tuple[str, float]:
    """The answer's text and the share of its prompt the cache served."""
    text, usage = "", None
    async for event in engine.generate(session, "q", prompt, Sampling(max_tokens=max_tokens)):
        if isinstance(event, TextDelta):
            text += event.text
        else:
            usage = event.usage
    assert usage is not None
    return text.strip(), usage.cached_tokens / max(usage.prompt_tokens, 1)


async def compare(model: str, *, frames: int, window: int, ask_every: int, scene: int, size: tuple[int, int] | None,
                  max_tokens: int = 3, seed: int = 7) -> Agreement:
    """Stream ``frames`` colour frames through a moving ``window`` on ``model`` and set every
    ``ask_every``-th window's answer and check against a cold prefill of it."""
    from server.models.colour_frames import COLOURS, colour_clip

    moving, cold = TransformersEngine(model), TransformersEngine(model, kv_shift=False)
    await moving.start()
    await cold.start()
    try:
        if not moving.capabilities.shifts_prefix:
            raise RuntimeError(f"{model}: the embedded engine cannot move this model's prefix (its rotary type)")
        rng = np.random.default_rng(seed)
        clip: list = []
        while len(clip) < frames:
            colour = COLOURS[len(clip) // scene * 3 % len(COLOURS)]
            clip += colour_clip(rng, [colour] * scene, moving.capabilities.max_image_side, size)
        seen = Agreement()
        for end in range(1, frames + 1):
            first = max(0, end - window)
            await moving.prefill("moving", window_prompt(clip[first:end], first))
            if (end - window) % ask_every or end < ask_every:
                continue
            question = window_prompt(clip[first:end], first, QUESTION)
            moved, cached = await _answer(moving, "moving", question, max_tokens)
            await cold.release("cold")
            fresh, _ = await _answer(cold, "cold", question, max_tokens)
            if moving.shifts == 0:
                seen.unmoved.append((moved, fresh))
                continue
            check = window_prompt(clip[first:end], first, CONDITION)
            [a] = await moving.check("moving", "w", [check])
            await cold.release("cold")
            [b] = await cold.check("cold", "w", [check])
            seen.answers.append((moved, fresh))
            seen.probability_gaps.append(abs(a.probability - b.probability))
            seen.cached_shares.append(cached)
        seen.shifts = moving.shifts
        return seen
    finally:
        await moving.close()
        await cold.close()


def run_shift(model: str | None, frames: int, window: int, ask_every: int, scene: int) -> Agreement:
    """``livesight bench shift``: prints the report and returns it. ``model`` "colours" (the
    default) is the demo model; "random" the random-weight model of real size; else a path."""
    from server.bench.served import bench_model
    from server.models.demo import shipped_model_dir

    if model in (None, "colours"):
        path, size, about = str(shipped_model_dir()), None, "the colours model"
    else:
        path = bench_model(None if model == "random" else model)
        size, about = CAMERA, ("the random-weight model of real size" if model == "random" else path)
    print(f"bench shift: {about}; {frames} frames through a window of {window}, scenes of {scene} frames; a question "
          f"and a check every {ask_every} frames once the window is full, each against a cold prefill", flush=True)
    started = time.perf_counter()
    seen = asyncio.run(compare(path, frames=frames, window=window, ask_every=ask_every, scene=scene, size=size))
    for line in seen.report():
        print(line)
    print(f"{time.perf_counter() - started:.0f} s")
    return seen
