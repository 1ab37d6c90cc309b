"""Per-session KV caches for the transformers engine, under one global token budget.

A ``SessionCache`` remembers which pieces (token runs and images) its KV cache holds, so a
new prompt reuses the longest leading run that is still identical and only the rest is
computed. Cutting back is exact: ``DynamicCache.crop`` drops everything after a piece
boundary (or after a token inside a text run; never inside an image).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from server.engines.prompt_encoding import Piece


@dataclass
class SessionCache:
    """What one session's KV cache holds, token by token."""

    kv: Any = None  # transformers Cache
    ids: list[int] = field(default_factory=list)
    # for each token: the image key it belongs to (None for text)
    owners: list[str | None] = field(default_factory=list)
    # for each token: one past its largest position (the next position after it)
    next_positions: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def next_position(self) -> int:
        return self.next_positions[-1] if self.next_positions else 0

    def common_prefix(self, pieces: list[Piece]) -> tuple[int, int]:
        """How much of ``pieces`` this cache already holds.

        Returns ``(tokens, whole_pieces)``: the number of leading tokens that match, and
        how many pieces are covered entirely. A match never ends inside an image.
        """
        matched = 0
        for index, piece in enumerate(pieces):
            n = len(piece.ids)
            held = self.ids[matched : matched + n]
            if piece.image_key is not None:
                same = held == list(piece.ids) and self.owners[matched] == piece.image_key
                if not same:
                    return matched, index
                matched += n
                continue
            if held == list(piece.ids):  # the usual case, compared in one go
                matched += n
                continue
            k = 0
            while k < len(held) and held[k] == piece.ids[k]:
                k += 1
            matched += k
            if k < n:
                return matched, index
        return matched, len(pieces)

    def first_token_of(self, image_key: str, after: int = 0) -> int | None:
        """The index of the first token of image ``image_key`` at or after ``after``, or None."""
        try:
            return self.owners.index(image_key, after)
        except ValueError:
            return None

    def crop(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens."""
        if length >= self.length:
            return
        if length == 0 or self.kv is None:
            self.clear()
            return
        self.kv.crop(length - self.length)  # negative: tokens to remove (a positive size is deprecated)
        del self.ids[length:], self.owners[length:], self.next_positions[length:]

    def append(self, ids: list[int], owners: list[str | None], next_positions: list[int]) -> None:
        """Record tokens that were just written into ``kv``."""
        self.ids.extend(ids)
        self.owners.extend(owners)
        self.next_positions.extend(next_positions)

    def clear(self) -> None:
        self.kv = None
        self.ids.clear()
        self.owners.clear()
        self.next_positions.clear()


class CacheBudget:
    """All sessions' caches, least recently used first, bounded by a total token count.

    A session held by a running request is never evicted: its request extends the cache
    step by step and would otherwise continue from an emptied one. While requests run, the
    total may therefore exceed the budget until they end.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._caches: OrderedDict[str, SessionCache] = OrderedDict()
        self._held: Counter[str] = Counter()
        self.evictions = 0

    @contextmanager
    def hold(self, session_id: str) -> Iterator[None]:
        """Keep the session's cache from eviction for the duration (one running request)."""
        self._held[session_id] += 1
        try:
            yield
        finally:
            self._held[session_id] -= 1
            if not self._held[session_id]:
                del self._held[session_id]

    def get(self, session_id: str) -> SessionCache:
        """The session's cache (created empty if needed), marked most recently used."""
        cache = self._caches.get(session_id)
        if cache is None:
            cache = self._caches[session_id] = SessionCache()
        self._caches.move_to_end(session_id)
        return cache

    def enforce(self, keep: str) -> None:
        """Clear least recently used caches (never ``keep``'s nor held ones) until the total fits."""
        total = sum(c.length for c in self._caches.values())
        for session_id, cache in list(self._caches.items()):
            if total <= self.max_tokens:
                break
            if session_id == keep or session_id in self._held or cache.length == 0:
                continue
            total -= cache.length
            cache.clear()
            self.evictions += 1

    def drop(self, session_id: str) -> None:
        self._caches.pop(session_id, None)

    def clear(self) -> None:
        self._caches.clear()

    @property
    def total_tokens(self) -> int:
        return sum(c.length for c in list(self._caches.values()))  # list(): another thread may add one
