"""The embedded engine moves a warm prefix when frames leave its front (``kv_shift``).

The rotation is exact: keys rotated by ``kv_shift.rotated`` equal the keys the model's own rotary
embedding gives at the new positions (plain RoPE for Idefics3's Llama, the three-row multimodal
positions of Qwen2.5-VL moved together). What is not exact is the content (the moved entries
were computed while the evicted frames were visible), so on the colours model, which knows what
the screen shows, a stream through many slides answers like a cold prefill of the same window.
"""

from __future__ import annotations

import pytest
import torch

from server.bench.shift import compare
from server.engines.hf_loading import load_model
from server.engines.kv_shift import rotary_frequencies, rotated
from server.models.demo import shipped_model_dir
from server.models.tiny import make_tiny_model

pytestmark = pytest.mark.anyio


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


@pytest.mark.parametrize("family", ["idefics3", "qwen2_5_vl"])
async def test_a_stream_through_many_slides_answers_like_a_cold_prefill(family: str) -> None:
    """The colours model, a window of 10 frames slid one frame at a time over 46 frames (scenes
    of 8 frames): the prefix is moved at every frame, each question finds >= 90% of its prompt
    cached, and every answer and every watch probability agrees with a cold prefill of the same
    window on an engine that never shifts (probabilities within 0.05)."""
    seen = await compare(str(shipped_model_dir(family)), frames=46, window=10, ask_every=4, scene=8, size=None)
    print("\n" + "\n".join(seen.report()))
    assert len(seen.answers) == 9 and seen.agreed == 9, seen.answers
    assert min(seen.cached_shares) >= 0.9
    assert max(seen.probability_gaps) <= 0.05
    assert seen.shifts >= 46 - 10 - 1
