"""A KV cache whose append costs O(new tokens), not O(cache).

transformers' ``DynamicLayer`` appends with ``torch.cat``, copying the whole cache on every
step: with thousands of warm prefix tokens, that copy is most of a query's time to first
token. ``GrowableLayer`` keeps keys and values in buffers with spare room (doubling when
full) and exposes views of the filled part, so appending writes only the new tokens and
cropping moves nothing. ``crop_to`` takes any cache back to a length (a check's scratch
tokens, appended after the session's, are cut off again that way).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowableLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by buffers with spare capacity."""

    min_capacity = 256

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new states; returns views of all keys and values so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        end = self._length + new
        if self._kbuf is None or end > self._kbuf.shape[-2]:
            self._grow(key_states, value_states, end)
        self._kbuf[..., self._length : end, :] = key_states
        self._vbuf[..., self._length : end, :] = value_states
        self._length = end
        self.keys = self._kbuf[..., :end, :]
        self.values = self._vbuf[..., :end, :]
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = max(self.min_capacity, needed * 2)
        kbuf = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        vbuf = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self._kbuf is not None and self._length:
            kbuf[..., : self._length, :] = self._kbuf[..., : self._length, :]
            vbuf[..., : self._length, :] = self._vbuf[..., : self._length, :]
        self._kbuf, self._vbuf = kbuf, vbuf

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """A negative value removes that many tokens; a positive one (transformers' legacy
        form) is the length to keep."""
        if not self.is_initialized:
            return
        keep = tokens_to_remove if tokens_to_remove > 0 else self._length + tokens_to_remove
        self._length = max(0, min(self._length, keep))
        self.keys = self._kbuf[..., : self._length, :]
        self.values = self._vbuf[..., : self._length, :]

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self._length = 0
        super().reset()


def new_cache(config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are growable."""
    cache = DynamicCache(config=config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowableLayer() for _ in cache.layers]
    return cache


def crop_to(cache: DynamicCache, length: int) -> None:
    """Cut every layer of ``cache`` to at most ``length`` tokens: the cache as it was before a
    step that appended to it, even one that failed part-way (its layers then differ in length).

    Raises ``RuntimeError`` for a layer that cannot go back (a sliding window already full)."""
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)
