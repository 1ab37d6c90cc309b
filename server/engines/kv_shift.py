"""Sliding a session's KV cache instead of rebuilding it: when frames leave the front of the
prompt, their entries are cut out and the entries after them move up, re-rotated to their new
positions.

A session's prompt loses its oldest frame (and the timestamp before it) while everything after
it stays the same. The cache then holds the prompt's head (system prompt and the opening of the
user turn), the evicted frame, and a long run of tokens the new prompt holds too, at positions
that are now too large. ``plan_shift`` finds that run (``Shift``); ``shift_cache`` keeps the
head, computes the few new tokens between the head and the run (the text there may differ:
the first retained frame's timestamp now follows the head directly), and appends the run's
keys and values after them, rotated back by the position gap.

Rotary position embedding makes that exact for the keys: a key stored at position ``p`` is the
unrotated key multiplied by the rotation of ``p`` (one angle per frequency pair), so moving it
to ``p - d`` multiplies it by the rotation of ``-d``. Qwen2-VL's multimodal positions (time,
height, width) move together by the same ``d``, so each frequency pair still turns by one
angle. Values carry no position. What is not exact is the content: the run's entries were
computed while the evicted frames were visible to them (as in StreamingLLM-style caches); the
head stays at the front as an attention sink. ``bench long`` measures the answers against a
cold prefill of the same window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from server.engines.growable_cache import GrowableLayer
from server.engines.kv_cache import SessionCache
from server.engines.prompt_encoding import Piece

#: The rope types whose frequencies do not depend on the sequence length (a rotation by a
#: fixed angle per pair moves a key); dynamic scaling changes them as the cache grows.
STATIC_ROPE = frozenset({"default", "linear", "llama3"})


@dataclass(frozen=True, slots=True)
class Shift:
    """How a cache becomes the start of a prompt: keep its first ``keep`` tokens, compute the
    prompt's ``new`` pieces after them, then move the ``length`` cached tokens from ``start`` on
    after those."""

    keep: int
    new: tuple[Piece, ...]
    start: int
    length: int

    @property
    def dropped(self) -> int:
        """Cached tokens between the kept head and the moved run (the evicted frames' own)."""
        return self.start - self.keep


def plan_shift(cache: SessionCache, pieces: list[Piece]) -> Shift | None:
    """The shift that makes the most of ``cache`` for ``pieces``, or None when the cache is
    already a prefix of them or holds nothing of them past the common head.

    The run to move starts at the first image of ``pieces`` after the common head that the cache
    holds further on, and goes on as far as cache and prompt agree token for token."""
    keep, whole = cache.common_prefix(pieces)
    if keep >= cache.length or cache.kv is None:
        return None
    offset = sum(len(p.ids) for p in pieces[:whole])
    for index in range(whole, len(pieces)):
        piece = pieces[index]
        if piece.image_key is not None:
            start = cache.first_token_of(piece.image_key, after=keep)
            if start is None:
                return None  # the first image after the head is new: nothing after it is cached
            break
        offset += len(piece.ids)
    else:
        return None
    ids = [i for p in pieces[index:] for i in p.ids]
    owners = [p.image_key for p in pieces[index:] for _ in p.ids]
    length = 0
    limit = min(len(ids), cache.length - start)
    while length < limit and cache.ids[start + length] == ids[length] and cache.owners[start + length] == owners[length]:
        length += 1
    new = _between(pieces, keep, offset)
    if start <= keep or length < sum(len(p.ids) for p in new):
        return None  # nothing left the front, or the run is shorter than what comes before it
    return Shift(keep, tuple(new), start, length)


def _between(pieces: list[Piece], start: int, end: int) -> list[Piece]:
    """The prompt's tokens ``start`` to ``end`` as pieces (only text pieces are ever split)."""
    out: list[Piece] = []
    position = 0
    for piece in pieces:
        n = len(piece.ids)
        lo, hi = max(start - position, 0), min(end - position, n)
        if lo < hi:
            out.append(piece if (lo, hi) == (0, n) else Piece(piece.ids[lo:hi]))
        position += n
        if position >= end:
            break
    return out


def rotary_frequencies(model: Any) -> torch.Tensor | None:
    """The language model's rotary frequencies (one per pair of a head's dimensions), or None
    when its keys cannot be moved by a rotation: no rotary embedding, or one whose frequencies
    change with the sequence length."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    rotary = getattr(decoder, "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return None
    return inv_freq.detach().to(torch.float64).cpu()


def can_shift(kv: Any) -> bool:
    """True when every layer of the cache is one whose entries can be taken out and put back."""
    return kv is not None and all(isinstance(layer, GrowableLayer) for layer in kv.layers)


def rotated(keys: torch.Tensor, by: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """``keys`` (…, tokens, head dim), rotated as if their positions were ``by`` larger (negative:
    smaller), in the half-split layout transformers' rotary embeddings use; computed in float32."""
    angle = by * inv_freq
    cos = torch.cat([angle.cos(), angle.cos()]).to(torch.float32).to(keys.device)
    sin = torch.cat([angle.sin(), angle.sin()]).to(torch.float32).to(keys.device)
    x = keys.float()
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + turned * sin).to(keys.dtype)


def take_run(kv: Any, start: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of every layer's keys and values of the cached tokens ``start`` .. ``start + length``."""
    end = start + length
    return [(layer.keys[..., start:end, :].clone(), layer.values[..., start:end, :].clone()) for layer in kv.layers]


def put_run(kv: Any, run: list[tuple[torch.Tensor, torch.Tensor]], by: int, inv_freq: torch.Tensor) -> None:
    """Append ``run`` (``take_run``) to every layer, its keys moved ``by`` positions."""
    for layer, (keys, values) in zip(kv.layers, run, strict=True):
        layer.update(rotated(keys, by, inv_freq) if by else keys, values)
