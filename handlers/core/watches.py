"""Watches: standing instructions ("tell me when someone is at the door"), pure.

A watch is a yes/no condition that the session checks on its warm prefix after accepted
frames: the condition is appended as a closed question turn, the engine reads how likely the
answer starts with yes from the next-token distribution (no decode step), and nothing of it
is kept: a check never enters the timeline. ``WatchBook`` holds a session's watches and
decides, from each check's probability, what happens:

- ``alert``: armed, it fires after ``confirm`` checks in a row at ``threshold`` or more
  (never twice within ``cooldown_s``); fired, it re-arms after ``clear`` checks in a row at
  ``clear_threshold`` or less (``watch.cleared``). Hysteresis: a probability between the two
  thresholds changes nothing.
- ``narrate``: fires after ``confirm`` checks at ``threshold`` or more of "has something
  changed worth saying" (or its own condition), at most every ``min_interval_s``; it needs no
  re-arming, and stays silent while nothing changed.

A fire is answered through the normal answer path (the adapter asks ``plan_watch``); that
answer enters the timeline as a turn marked as triggered. Times are seconds on the caller's
monotonic clock, never compared with a fixed origin.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from handlers.core.events import Event, WatchChecked, WatchCleared, WatchCreated, WatchDeleted, WatchFired, WatchUpdated
from handlers.core.frames import Frame
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.fields import MAX_ANSWER_TOKENS
from handlers.wire.protocol import WatchCreate, WatchDelete, WatchSpec, WatchUpdate, describe_validation_error

#: The condition of a ``narrate`` watch that names none.
NARRATE_CONDITION = "Has something changed in the scene since the last description that is worth saying?"
#: What a check asks after the condition: nothing. The condition is a yes/no question as the
#: user wrote it; an added "Answer yes or no." moved a model trained on plain questions off
#: its answers, and instruction-tuned models answer a plain yes/no question with yes or no.
CHECK_SUFFIX = ""
#: What a fired alert is asked when its watch names no instructions.
ALERT_INSTRUCTIONS = "In one short sentence, say what you see now that made this true: {condition}"
NARRATE_INSTRUCTIONS = "In one short sentence, describe what changed."
#: A fired answer's default length.
WATCH_ANSWER_TOKENS = 48


def check_question(spec: WatchSpec) -> str:
    """The question turn a check appends to the warm prefix."""
    return (spec.condition or NARRATE_CONDITION).strip() + CHECK_SUFFIX


def check_tokens(spec: WatchSpec) -> int:
    """The tokens a check adds to the prefix, estimated at 4 characters a token (the core has
    no tokenizer) plus the chat template's few."""
    return len(check_question(spec)) // 4 + 8


def fire_question(spec: WatchSpec) -> str:
    """What the answer of a fire is asked (it is the triggered turn's question in the timeline)."""
    if spec.response.instructions:
        return spec.response.instructions
    if spec.kind == "narrate":
        return NARRATE_INSTRUCTIONS
    return ALERT_INSTRUCTIONS.format(condition=(spec.condition or "").strip())


@dataclass
class Watch:
    """One watch and its debouncing state."""

    spec: WatchSpec
    armed: bool = True
    above: int = 0  # checks in a row at threshold or more (while armed)
    below: int = 0  # checks in a row at clear_threshold or less (while fired)
    last_fire_s: float | None = None
    checks: int = 0

    @property
    def watch_id(self) -> str:
        assert self.spec.watch_id is not None
        return self.spec.watch_id


@dataclass(frozen=True, slots=True)
class Fire:
    """A watch fired on ``frame``: send ``event``, then answer ``question``."""

    watch: Watch
    frame: Frame | None
    event: WatchFired
    question: str


@dataclass
class Decisions:
    """What a round of checks decided: events to send now and fires to answer (the first only:
    one answer at a time; the others are counted as ``suppressed``)."""

    events: list[Any] = field(default_factory=list)
    fires: list[Fire] = field(default_factory=list)
    checks: int = 0  # checks that ran to the end in this round
    skipped: int = 0  # accepted frames no check looked at, since the round before


class WatchBook:
    """A session's watches, at most ``max_watches``."""

    def __init__(self, max_watches: int, max_answer_tokens: int = MAX_ANSWER_TOKENS) -> None:
        self.max_watches = max_watches
        self.max_answer_tokens = max_answer_tokens
        self._watches: dict[str, Watch] = {}
        self._ids = itertools.count(1)
        self.checks = 0
        self.fires = 0

    @classmethod
    def of(cls, specs: list[WatchSpec], max_watches: int, max_answer_tokens: int = MAX_ANSWER_TOKENS) -> WatchBook:
        """A book holding ``specs`` (a config's list). Raises ``too_many_watches`` and
        ``invalid_watch`` (an id twice)."""
        if len(specs) > max_watches:
            raise SessionError(ErrorCode.TOO_MANY_WATCHES, f"a session may hold {max_watches} watches")
        ids = [spec.watch_id for spec in specs if spec.watch_id is not None]
        twice = next((watch_id for watch_id in ids if ids.count(watch_id) > 1), None)
        if twice is not None:
            raise SessionError(ErrorCode.INVALID_WATCH, f"watch id {twice!r} is in the list twice")
        book = cls(max_watches, max_answer_tokens)
        for spec in specs:
            book.create(spec)
        return book

    def __len__(self) -> int:
        return len(self._watches)

    def __iter__(self):  # noqa: ANN204 - an iterator of Watch
        return iter(list(self._watches.values()))

    def get(self, watch_id: str) -> Watch:
        """Raises ``unknown_watch``."""
        watch = self._watches.get(watch_id)
        if watch is None:
            raise SessionError(ErrorCode.UNKNOWN_WATCH, f"no watch {watch_id[:64]!r} in this session")
        return watch

    # ------------------------------------------------------------------ create, update, delete
    def apply(self, event: WatchCreate | WatchUpdate | WatchDelete) -> Event:
        """``watch.create`` / ``.update`` / ``.delete``; returns the event to send (a created
        watch with the tokens each check adds to the prefix). Raises ``invalid_watch``,
        ``unknown_watch`` and ``too_many_watches``."""
        if isinstance(event, WatchCreate):
            created = self.create(WatchSpec.model_validate(event.model_dump(exclude={"type"})))
            return created.model_copy(update={"tokens_per_check": check_tokens(self.get(created.watch["watch_id"]).spec)})
        if isinstance(event, WatchUpdate):
            return self.update(event.watch_id, event.changes)
        return self.delete(event.watch_id)

    def create(self, spec: WatchSpec) -> WatchCreated:
        """Add a watch (named ``w<N>`` when it has no id). Raises ``too_many_watches`` and
        ``invalid_watch`` (an id in use)."""
        if len(self._watches) >= self.max_watches:
            raise SessionError(ErrorCode.TOO_MANY_WATCHES, f"a session may hold {self.max_watches} watches")
        watch_id = spec.watch_id
        if watch_id is None:
            watch_id = next(f"w{n}" for n in self._ids if f"w{n}" not in self._watches)
        elif watch_id in self._watches:
            raise SessionError(ErrorCode.INVALID_WATCH, f"watch {watch_id!r} exists; update or delete it")
        spec = self._bounded(spec.model_copy(update={"watch_id": watch_id}))
        self._watches[watch_id] = Watch(spec)
        return WatchCreated(watch=effective(spec), tokens_per_check=None)

    def update(self, watch_id: str, changes: dict[str, Any]) -> WatchUpdated:
        """Change a watch's fields (its id and kind stay). Its state starts afresh when its
        condition or kind changes. Raises ``unknown_watch`` and ``invalid_watch``."""
        watch = self.get(watch_id)
        if "watch_id" in changes and changes["watch_id"] != watch_id:
            raise SessionError(ErrorCode.INVALID_WATCH, "a watch's id cannot change")
        merged = {**watch.spec.model_dump(), **changes, "watch_id": watch_id}
        spec = self._bounded(validate_watch(merged))
        fresh = (spec.condition, spec.kind) != (watch.spec.condition, watch.spec.kind)
        self._watches[watch_id] = Watch(spec) if fresh else Watch(
            spec, watch.armed, watch.above, watch.below, watch.last_fire_s, watch.checks
        )
        return WatchUpdated(watch=effective(spec))

    def delete(self, watch_id: str) -> WatchDeleted:
        """Remove a watch (a check of it that is running is not reported). Raises ``unknown_watch``."""
        self.get(watch_id)
        del self._watches[watch_id]
        return WatchDeleted(watch_id=watch_id)

    def _bounded(self, spec: WatchSpec) -> WatchSpec:
        tokens = spec.response.max_tokens
        if tokens is not None and tokens > self.max_answer_tokens:
            spec = spec.model_copy(update={"response": spec.response.model_copy(update={"max_tokens": self.max_answer_tokens})})
        return spec

    # ------------------------------------------------------------------ checks
    def record(self, results: list[tuple[str, float, float]], frame: Frame | None, now_s: float,
               decision_ms: float | None = None) -> Decisions:
        """Apply one round of checks on ``frame`` (the newest frame of the prefix): ``results``
        holds (watch id, probability of yes, ms the check took) per watch checked; ``now_s``
        is the caller's monotonic clock, ``decision_ms`` the time since the frame was received.
        Watches deleted meanwhile are passed over. Returns the events and fires."""
        out = Decisions()
        self.checks += 1
        for watch_id, probability, ms in results:
            watch = self._watches.get(watch_id)
            if watch is None:
                continue
            watch.checks += 1
            spec = watch.spec
            frame_id = frame.frame_id if frame is not None else None
            if spec.report_checks:
                out.events.append(WatchChecked(watch_id=watch_id, frame_id=frame_id, probability=round(probability, 4),
                                             ms=round(ms, 2)))
            if self._decide(watch, probability, now_s):
                event = WatchFired(watch_id=watch_id, frame_id=frame_id, pts_ms=frame.pts_ms if frame else None,
                                   probability=round(probability, 4),
                                   decision_ms=None if decision_ms is None else round(decision_ms, 1))
                out.events.append(event)
                out.fires.append(Fire(watch, frame, event, fire_question(spec)))
                self.fires += 1
            elif not watch.armed and watch.below >= spec.clear and spec.kind == "alert":
                watch.armed, watch.below = True, 0
                out.events.append(WatchCleared(watch_id=watch_id, frame_id=frame_id, probability=round(probability, 4)))
        return out

    @staticmethod
    def _decide(watch: Watch, probability: float, now_s: float) -> bool:
        """Move the watch's debouncing state by one check; True when it fires now."""
        spec = watch.spec
        if spec.kind == "alert" and not watch.armed:
            watch.below = watch.below + 1 if probability <= spec.clear_threshold else 0
            return False
        watch.above = watch.above + 1 if probability >= spec.threshold else 0
        if watch.above < spec.confirm:
            return False
        wait_s = spec.cooldown_s if spec.kind == "alert" else spec.min_interval_s
        if watch.last_fire_s is not None and now_s - watch.last_fire_s < wait_s:
            return False  # true, but too soon: an alert stays armed and fires once the time is up
        watch.above = 0
        watch.last_fire_s = now_s
        if spec.kind == "alert":
            watch.armed, watch.below = False, 0
        return True


def validate_watch(data: dict[str, Any]) -> WatchSpec:
    """A watch spec from plain fields. Raises ``invalid_watch``."""
    try:
        return WatchSpec.model_validate(data)
    except ValidationError as exc:
        raise SessionError(ErrorCode.INVALID_WATCH, f"watch: {describe_validation_error(exc)}") from None


def effective(spec: WatchSpec) -> dict[str, Any]:
    """The watch as the server runs it, for ``watch.created`` / ``watch.updated``."""
    out = spec.model_dump()
    out.pop("type", None)
    if out["condition"] is None:
        out["condition"] = NARRATE_CONDITION
    return out
