"""A tiny random model that says yes or no: the check tests' model.

The generated tiny models' tokenizers have no "yes" token (their byte-level BPE splits the word),
so a check on them would always read 0. This one is a sharp tiny model (``init_std=0.3``: its
next-token distributions differ from prompt to prompt) with the yes and no words added to its
tokenizer as tokens, and a last layer that writes a large positive value into one hidden
feature at every position, which the yes and no tokens' output rows read: every next-token
distribution puts those tokens on top (so a server's top-20 log probabilities hold all of
them), while which of them wins still depends on the prompt.

The positive value: ``PAIRS`` pairs of the last MLP's units, each pair with gate and up rows
``+s e_i`` and ``-s e_i``, sum to ``s^2 n_i^2`` (``silu(u) u + silu(-u) (-u) = u^2``) for the
normalised input ``n``; their down-projection column writes only into ``FEATURE``.
"""

from __future__ import annotations

from pathlib import Path

import torch

#: Tokens added for the check's words (the ones a tokenizer already has are kept as they are).
ANSWER_TOKENS = ("yes", " yes", "Yes", " Yes", "no", " no", "No", " No")
SHARP_STD = 0.3
FEATURE = 0  # the hidden dimension the last layer makes large
PAIRS = 48  # MLP unit pairs that write it
PAIR_SCALE = 1.0  # s: their gate and up rows
PAIR_OUTPUT = 20.0  # their down-projection weight into the feature
FEATURE_WEIGHT = 4.0  # what the yes and no tokens' output rows read of it


def make_yes_no_model(out_dir: Path, family: str, seed: int = 0) -> Path:
    """Write a tiny ``family`` model whose next token is nearly always a yes or no word; returns ``out_dir``."""
    from transformers import AutoTokenizer

    from server.engines.hf_loading import load_model
    from server.engines.yes_no import answer_token_ids
    from server.models.tiny import make_tiny_model

    make_tiny_model(out_dir, family=family, init_std=SHARP_STD, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.add_tokens([t for t in ANSWER_TOKENS if t not in tokenizer.get_vocab()])
    model = load_model(str(out_dir))
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    yes, no = answer_token_ids(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            table[old:] = torch.randn(table[old:].shape, generator=generator) * SHARP_STD
        mlp = _last_mlp(model)
        for pair in range(PAIRS):
            for sign, unit in ((1.0, 2 * pair), (-1.0, 2 * pair + 1)):
                for proj in (mlp.gate_proj, mlp.up_proj):
                    proj.weight[unit] = 0.0
                    proj.weight[unit, FEATURE + 1 + pair] = sign * PAIR_SCALE
                mlp.down_proj.weight[:, unit] = 0.0
                mlp.down_proj.weight[FEATURE, unit] = PAIR_OUTPUT
        model.get_output_embeddings().weight[list(yes + no), FEATURE] = FEATURE_WEIGHT
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _last_mlp(model: torch.nn.Module) -> torch.nn.Module:
    """The MLP of the text model's last decoder layer (Llama and Qwen2 alike)."""
    mlps = [m for name, m in model.named_modules() if name.endswith(".mlp") and hasattr(m, "gate_proj")
            and "visual" not in name and "vision" not in name]
    return mlps[-1]
