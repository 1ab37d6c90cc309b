"""Hostile watch lists in ``session.update`` on /v1/realtime, each with the answer
docs/realtime.md gives it (the fuzz test's realtime watch storm).

``session.livesight.watches`` replaces the session's watches. A list that is valid as a whole
(every watch as ``watch.create`` takes it, its ids unique, at most ``max_watches``) is applied:
``session.updated`` echoes it. Any other is refused whole: the session keeps the watches it
had, ``session.updated`` lists the part in ``livesight.refused``, and an ``error``
``invalid_value`` carries the event's ``event_id``. A message with a lone surrogate anywhere
(a value, or the name of a field a watch does not have) is refused before it is read, as on
every endpoint: one ``error`` ``invalid_value`` with no ``event_id``, no ``session.updated``,
the watches unchanged. The watches themselves come from ``WatchCases`` (the v1 storm's values:
odd Unicode, boundary values, wrong types, values out of range, unknown fields, which a watch
ignores); ``WatchLists`` keeps its own model of the session's watches, written from the docs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from server.bench.fuzz_watches import SURROGATES, VALID_IDS, Watch, WatchCases, dumps, shown

VALID = "valid list"
#: A message with a lone surrogate: refused before it is read (the JSON front end every codec shares).
SURROGATE = "a lone surrogate in a watch's "
#: A part that is not a list of watch objects.
NOT_LISTS: list[Any] = ["Is it red?", 5, True, {"watch_id": "a", "condition": "x?"}, [1], ["a"], [[]], [None]]


@dataclass(frozen=True)
class ListCase:
    """One ``session.update`` and what must come back: the session's watch ids after it,
    whether the list was refused, and whether the whole message was refused unread (a lone
    surrogate: one error with no event id, no ``session.updated``)."""

    raw: str
    event_id: str
    watch_ids: list[str]
    refused: bool
    what: str
    unread: bool = False

    def __repr__(self) -> str:
        return f"ListCase({self.what} -> {'refused' if self.refused else self.watch_ids}: {shown(self.raw)!r})"


@dataclass
class WatchLists:
    """The session's watch ids as the docs describe them, and watch lists generated against
    them."""

    max_watches: int
    rng: random.Random
    watch_ids: list[str] = field(default_factory=list)
    sent: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._values = WatchCases(max_watches=self.max_watches, rng=self.rng)

    def next(self) -> ListCase:
        """The next ``session.update`` and its answer."""
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            watches, what = self._valid_list(), VALID
        elif r < 0.5:
            watches, what = self._valid_list(), "a watch with a bad field"
            if not watches:
                watches = [self._valid_watch("w1")]
            name, value, what = self._values._bad_field()
            watches[rng.randrange(len(watches))][name] = value
        elif r < 0.6:
            watches, what = self._valid_list(), "an inconsistent watch"
            watches.append({"watch_id": "bad", **rng.choice([
                {"kind": "alert"}, {"condition": rng.choice([" ", "\t\n", "\u3000"])},
                {"condition": "x?", "threshold": 0.3, "clear_threshold": 0.5},
                {"condition": "z" * 1_001}])})
        elif r < 0.7:
            watches = self._valid_list() or [self._valid_watch("d")]
            watches.append({**watches[0], "condition": "Again?"})
            what = "an id twice"
        elif r < 0.78:
            watches = [self._valid_watch(f"n{i}") for i in range(self.max_watches + rng.randint(1, 3))]
            what = "too many"
        elif r < 0.88:
            watches, what = rng.choice(NOT_LISTS), "not a list of watches"
        else:
            watches = self._valid_list() or [self._valid_watch("s")]
            where = rng.choice(["condition", "watch_id", "key", "instructions"])
            s = rng.choice(SURROGATES)
            target = watches[rng.randrange(len(watches))]
            if where == "key":  # the name of a field a watch does not have
                target[s] = 1
            elif where == "instructions":
                target["response"] = {"instructions": s}
            else:
                target[where] = s
            what = SURROGATE + where
        return self._case(watches, what)

    def _case(self, watches: Any, what: str) -> ListCase:
        """Every list but a valid one (``_valid_list``: each watch valid, ids unique, at most
        ``max_watches``; maybe with fields a watch does not have) is refused whole."""
        self.sent += 1
        event_id = f"evt_{self.sent}"
        raw = dumps({"type": "session.update", "event_id": event_id,
                     "session": {"type": "realtime", "livesight": {"watches": watches}}})
        refused = what != VALID
        if not refused:
            self.watch_ids = [w["watch_id"] for w in watches]
        unread = what.startswith(SURROGATE)
        key = "unread" if unread else "refused" if refused else "applied"
        self.counts[key] = self.counts.get(key, 0) + 1
        return ListCase(raw, event_id, list(self.watch_ids), refused, what, unread)

    def _valid_list(self) -> list[dict[str, Any]]:
        """Up to ``max_watches`` valid watches with unique ids (sometimes with fields a watch
        does not have, which it ignores)."""
        ids = self.rng.sample(VALID_IDS, self.rng.randint(0, min(self.max_watches, len(VALID_IDS))))
        return [self._valid_watch(watch_id) for watch_id in ids]

    def _valid_watch(self, watch_id: str) -> dict[str, Any]:
        """A watch of the right field types and ranges (``WatchCases._spec``), consistent."""
        values = self._values
        for _ in range(100):
            spec = {**values._spec(), "watch_id": watch_id}
            watch = Watch(spec.get("condition"), spec.get("kind", "alert"), spec.get("threshold", 0.6),
                          spec.get("clear_threshold", 0.4))
            if WatchCases._consistent(watch):
                if self.rng.random() < 0.1:
                    spec.update(values._unknown_fields())
                return spec
        return {"watch_id": watch_id, "condition": "Is it red?"}
