"""The embedded engine moves a warm prefix when frames leave its front (``kv_shift``).

The rotation is exact: keys rotated by ``kv_shift.rotated`` equal the keys the model's own rotary
embedding gives at the new positions (plain RoPE for Idefics3's Llama, the three-row multimodal
positions of Qwen2.5-VL moved together). What is not exact is the content (the moved entries
were computed while the evicted frames were visible), so on the colours model, which knows what
the screen shows, a stream through many slides answers like a cold prefill of the same window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.core.prompt import DEFAULT_SYSTEM_PROMPT
from server.engines.base import ChatTurn, ImageSegment, Prompt, Sampling, TextDelta, TextSegment
from server.engines.hf_loading import load_model
from server.engines.kv_shift import rotary_frequencies, rotated
from server.engines.transformers_engine import TransformersEngine
from server.models.colour_frames import COLOURS, colour_clip
from server.models.demo import shipped_model_dir
from server.models.tiny import make_tiny_model

pytestmark = pytest.mark.anyio

QUESTION = "What colour is the screen? Answer in one word."


@pytest.mark.parametrize("family", ["idefics3", "qwen2_5_vl"])
def test_rotated_keys_equal_keys_at_their_new_positions(family: str, tmp_path) -> None:
    """Keys at position p, rotated by -d, are the keys at p - d (to float32 rounding)."""
    model = load_model(str(make_tiny_model(tmp_path / family, family=family)), "auto", "cpu", False)
    inv_freq = rotary_frequencies(model)
    assert inv_freq is not None
    rotary = model.get_decoder().rotary_emb
    head = inv_freq.numel() * 2
    keys = torch.randn(1, 2, 5, head)
    at = torch.tensor([[900, 901, 902, 1500, 1501]])
    moved = at - 873

    def rope(positions: torch.Tensor) -> torch.Tensor:
        """Keys at ``positions`` as the model's attention rotates them (Qwen: its three rows
        mixed by the rotary embedding itself, then the same half-split rotation)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = rotary(keys, positions.expand(3, 1, -1) if family == "qwen2_5_vl" else positions)
        return apply_rotary_pos_emb(keys, keys, cos, sin)[1]

    assert torch.allclose(rotated(rope(at), -873, inv_freq), rope(moved), atol=1e-4)
    assert not torch.allclose(rope(at), rope(moved), atol=1e-2)


def _prompt(frames: list, first: int, question: str | None = None) -> Prompt:
    segments: list = []
    for n, frame in enumerate(frames):
        segments += [TextSegment(f"[{(first + n) * 0.5:.1f}s]"), ImageSegment(frame.key, frame.pixels)]
    turns = (ChatTurn("system", (TextSegment(DEFAULT_SYSTEM_PROMPT),)),)
    if question is None:
        return Prompt(turns + (ChatTurn("user", tuple(segments)),), open_turn=True)
    return Prompt(turns + (ChatTurn("user", (*segments, TextSegment("\n" + question))),))


async def _answer(engine: TransformersEngine, session: str, prompt: Prompt) -> tuple[str, int, int]:
    text, usage = "", None
    async for event in engine.generate(session, "q", prompt, Sampling(max_tokens=3)):
        if isinstance(event, TextDelta):
            text += event.text
        else:
            usage = event.usage
    assert usage is not None
    return text.strip(), usage.cached_tokens, usage.prompt_tokens


@pytest.mark.parametrize("family", ["idefics3", "qwen2_5_vl"])
async def test_a_stream_through_many_slides_answers_like_a_cold_prefill(family: str) -> None:
    """The colours model, a window of 10 frames slid one frame at a time over 46 frames (scenes
    of 8 frames): the prefix is moved at every frame, each question finds >= 90% of its prompt
    cached, and every answer and every watch probability agrees with a cold prefill of the same
    window on an engine that never shifts (probabilities within 0.05)."""
    model = str(shipped_model_dir(family))
    shifting, cold = TransformersEngine(model), TransformersEngine(model, kv_shift=False)
    await shifting.start()
    await cold.start()
    try:
        assert shifting.capabilities.shifts_prefix and not cold.capabilities.shifts_prefix
        rng = np.random.default_rng(7)
        frames = []
        for scene in range(6):
            frames += colour_clip(rng, [COLOURS[scene * 3 % len(COLOURS)]] * 8, shifting.capabilities.max_image_side)
        window, asked, agreed = 10, 0, 0
        for end in range(1, 47):
            first = max(0, end - window)
            await shifting.prefill("s", _prompt(frames[first:end], first))
            if end > window and end % 4 == 0:
                query = _prompt(frames[first:end], first, QUESTION)
                moved, cached, total = await _answer(shifting, "s", query)
                await cold.release("c")
                fresh, _, _ = await _answer(cold, "c", query)
                check = _prompt(frames[first:end], first, "Is the screen red? Answer yes or no.")
                [a] = await shifting.check("s", "w", [check])
                await cold.release("c")
                [b] = await cold.check("c", "w", [check])
                asked += 1
                agreed += moved == fresh
                assert cached >= 0.9 * total, (cached, total)
                assert a.probability == pytest.approx(b.probability, abs=0.05)
        assert asked == 9 and agreed == asked
        assert shifting.shifts >= 46 - window - 1
    finally:
        await shifting.close()
        await cold.close()
