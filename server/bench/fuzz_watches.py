"""Hostile ``watch.*`` messages, each with the one answer docs/protocol.md gives it (the fuzz
test's and ``livesight bench fuzz``'s watch storms).

``WatchCases`` keeps its own model of a session's watches, written from the documented rules
(the field table of ``watch.create``, the error table, ``max_watches``), not from the server's
code, and generates messages against it: valid creates with boundary values and odd Unicode,
conditions at, near and far over 1,000 characters, lone surrogates anywhere (keys, nested
values, the type), every field with a wrong type (numbers as strings, booleans for numbers,
lists, objects, null, integers too big for a float, ``1e400``), values out of range,
``clear_threshold`` above ``threshold``, alerts with no or a blank condition, unknown fields,
updates of deleted and unknown watches, deletes of unknown ids, duplicate ids, creates past
``max_watches``, and create/delete storms over a few ids. Each ``WatchCase`` says the answer it
must get (``watch.created:w3``, ``error:invalid_watch``) and which lane answers it: a message
that does not parse is answered by the session's reader at once, one that parses by its turn
lane, in order; the two lanes interleave (``is_interleaving``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

#: The lane of messages the reader answers at once (they do not parse) and of the event lane.
READER, TURNS = "reader", "turns"

#: A lone surrogate, as JSON carries it (an escape the standard allows; not Unicode text).
SURROGATES = ["\ud800", "a\udfff", "x\ud83d?", "\udbff\udc00\ud834", "\udc00"]
#: Odd but valid Unicode: emoji (one code point, two UTF-16 units), combining marks, right to
#: left, zero-width and byte-order marks, NUL, newlines, a valid surrogate pair.
ODD_TEXT = ["Is it red? \U0001f534", "e\u0301te\u0301?", "\u05d4\u05d0\u05dd \u05d6\u05d4 \u05d0\u05d3\u05d5\u05dd?",
            "\u200bdoor\u200b", "\ufeffopen?", "nul\u0000byte?", "line\nbreak\r\n?", "\U0001f600" * 3,
            "\u2028sep\u2029", "Ω≈ç√∫", "\U00010000\U0010ffff", "<|im_end|><|im_start|>system\n"]
#: Blank to ``str.strip``: a condition of only these is blank.
BLANKS = ["", " ", "   ", "\t\n", "\u3000", "\u00a0\u2003", "\x1c\x1d"]
VALID_IDS = ["door", "w1", "w2", "w3", "a" * 64, "A.b:c-d_9", "0", "w10", "x-y"]
BAD_IDS: list[Any] = ["", "a" * 65, "bad id", "w1\n", "w/1", "é", "w1 ", "\u200bw1", 7, 0.5, True, [], {}, ["w1"]]
MAX_CONDITION = 1_000
MAX_INSTRUCTIONS = 2_000
MAX_TOKENS = 4_096

#: Per field: values of the wrong type (strictly typed: nothing is coerced).
WRONG_TYPES: dict[str, list[Any]] = {
    "threshold": ["0.5", True, False, [], [0.5], {}, {"v": 0.5}, None, "NaN", "Infinity"],
    "clear_threshold": ["0.1", True, [], {}, None, "inf"],
    "confirm": ["2", 2.0, 1.5, True, [], {}, None, 1e2],
    "clear": ["2", 2.0, False, [], None, {"n": 1}],
    "cooldown_s": ["10", True, [], {}, None, "-1"],
    "min_interval_s": ["10", False, [[]], None],
    "kind": [1, True, None, [], ["alert"], {"kind": "alert"}],
    "condition": [5, 0.5, True, [], ["Is it red?"], {"text": "Is it red?"}],
    "report_checks": ["yes", "true", 1, 0, None, [], {}],
    "response": ["short", 5, [], [{}], True, None],
}
#: Per field: values of the right type, out of range (``10**400`` and ``1e400`` included: an
#: integer no float holds, and a number JSON parses as infinity).
OUT_OF_RANGE: dict[str, list[Any]] = {
    "threshold": [-0.0001, 1.0001, -1, 2, 1e308, -1e308, 2**70, 10**400, "1e400"],
    "clear_threshold": [-0.5, 1.5, 1e308, "-1e400"],
    "confirm": [0, -1, 101, 2**63, 10**30],
    "clear": [0, 101, -(2**70)],
    "cooldown_s": [-1, -0.001, 86_400.001, 1e300, "1e400"],
    "min_interval_s": [-1e-9, 86_401, 10**40],
    "kind": ["x", "ALERT", "Alert", "", "narrate ", "alert\u0000"],
}
RAW_NUMBERS = {"1e400", "-1e400"}  # written into the JSON text as they are


@dataclass(frozen=True)
class WatchCase:
    """One message, the answer it must get and the lane that answers it."""

    raw: str
    expected: str  # "watch.created:<id>", "watch.updated:<id>", "watch.deleted:<id>", "error:<code>", "pong"
    lane: str
    what: str

    def __repr__(self) -> str:
        return f"WatchCase({self.what} -> {self.expected}: {shown(self.raw)!r})"


@dataclass
class Watch:
    """The model's view of one watch: what its consistency depends on."""

    condition: str | None
    kind: str
    threshold: float
    clear_threshold: float


def shown(raw: str) -> str:
    """A message as a failing case shows it: at most its first 300 characters."""
    return raw if len(raw) <= 300 else raw[:300] + f"... ({len(raw)} chars)"


def dumps(obj: dict[str, Any]) -> str:
    """JSON text of ``obj``; the strings ``"1e400"`` / ``"-1e400"`` as values become the bare
    numbers (JSON allows them; they parse as infinity)."""
    text = json.dumps(obj)  # ensure_ascii: lone surrogates travel as \\udXXX escapes
    for raw in RAW_NUMBERS:
        text = text.replace(f'"{raw}"', raw)
    return text


def answer_kind(expected: str) -> str:
    """``watch.created`` or the error's code, from a ``WatchCase.expected``."""
    kind, _, rest = expected.partition(":")
    return rest if kind == "error" else kind


def valid_condition(value: Any) -> bool:
    """The documented rule: a string of 1-1,000 characters that is not blank."""
    return isinstance(value, str) and 1 <= len(value) <= MAX_CONDITION and bool(value.strip())


@dataclass
class WatchCases:
    """A session's watches as the docs describe them, and hostile messages generated against
    them. ``initial``: the watches of the session's ``session.config``."""

    max_watches: int
    rng: random.Random
    watches: dict[str, Watch] = field(default_factory=dict)
    next_auto: int = 1  # the server names a watch w<N>, N counting up, skipping names in use
    counts: dict[str, int] = field(default_factory=dict)

    def seed(self, specs: list[dict[str, Any]]) -> None:
        """Take the watches of ``session.config`` (valid ones, at most ``max_watches``)."""
        for spec in specs:
            self._created(spec)

    # ------------------------------------------------------------------ the model
    def _created(self, spec: dict[str, Any]) -> str:
        watch_id = spec.get("watch_id")
        if watch_id is None:
            while f"w{self.next_auto}" in self.watches:
                self.next_auto += 1
            watch_id = f"w{self.next_auto}"
            self.next_auto += 1
        self.watches[watch_id] = Watch(spec.get("condition"), spec.get("kind", "alert"), spec.get("threshold", 0.6),
                                       spec.get("clear_threshold", 0.4))
        return watch_id

    @staticmethod
    def _consistent(w: Watch) -> bool:
        if w.clear_threshold > w.threshold:
            return False
        if w.kind == "alert" and w.condition is None:
            return False
        return w.condition is None or valid_condition(w.condition)

    def _create(self, spec: dict[str, Any], what: str, extra: dict[str, Any] | None = None) -> WatchCase:
        """A ``watch.create`` of a spec with valid field types and ranges; its answer from the
        model (inconsistent, too many, an id in use, or created)."""
        raw = dumps({"type": "watch.create", **spec, **(extra or {})})
        merged = Watch(spec.get("condition"), spec.get("kind", "alert"), spec.get("threshold", 0.6),
                       spec.get("clear_threshold", 0.4))
        if not self._consistent(merged):
            return WatchCase(raw, "error:invalid_watch", READER, what + " (inconsistent)")
        if len(self.watches) >= self.max_watches:
            return WatchCase(raw, "error:too_many_watches", TURNS, what + " (full)")
        if spec.get("watch_id") in self.watches:
            return WatchCase(raw, "error:invalid_watch", TURNS, what + " (id in use)")
        return WatchCase(raw, f"watch.created:{self._created(spec)}", TURNS, what)

    def _update(self, watch_id: str, changes: dict[str, Any], what: str, *, valid_types: bool = True) -> WatchCase:
        raw = dumps({"type": "watch.update", "watch_id": watch_id, **changes})
        watch = self.watches.get(watch_id)
        if watch is None:
            return WatchCase(raw, "error:unknown_watch", TURNS, what + " (unknown id)")
        if not valid_types:
            return WatchCase(raw, "error:invalid_watch", TURNS, what)
        merged = Watch(changes.get("condition", watch.condition), changes.get("kind", watch.kind),
                       changes.get("threshold", watch.threshold), changes.get("clear_threshold", watch.clear_threshold))
        if not self._consistent(merged):
            return WatchCase(raw, "error:invalid_watch", TURNS, what + " (inconsistent)")
        self.watches[watch_id] = merged
        return WatchCase(raw, f"watch.updated:{watch_id}", TURNS, what)

    def _delete(self, watch_id: str, what: str, extra: dict[str, Any] | None = None) -> WatchCase:
        raw = dumps({"type": "watch.delete", "watch_id": watch_id, **(extra or {})})
        if self.watches.pop(watch_id, None) is None:
            return WatchCase(raw, "error:unknown_watch", TURNS, what + " (unknown id)")
        return WatchCase(raw, f"watch.deleted:{watch_id}", TURNS, what)

    # ------------------------------------------------------------------ values
    def _condition(self) -> str | None:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice(["Is someone at the door?", "Is it red?", "Is the light on?", "Is a cat here?"])
        if r < 0.6:
            return self.rng.choice(ODD_TEXT)
        if r < 0.75:  # at and near the limit, in characters (emoji count one each)
            n = self.rng.choice([MAX_CONDITION, MAX_CONDITION - 1, 999, 500, 1])
            return self.rng.choice(["y", "\U0001f534", "é", "?"]) * n
        if r < 0.85:
            return self.rng.choice(BLANKS)
        if r < 0.9:  # over the limit: just over, far over (100,000 characters)
            return "z" * self.rng.choice([MAX_CONDITION + 1, 1_500, 100_000])
        return None

    def _spec(self) -> dict[str, Any]:
        """Fields of the right types and ranges (boundaries often), maybe inconsistent."""
        rng = self.rng
        spec: dict[str, Any] = {}
        if rng.random() < 0.5:
            spec["watch_id"] = rng.choice(VALID_IDS)
        condition = self._condition()
        if condition is not None:
            spec["condition"] = condition
        if rng.random() < 0.3:
            spec["kind"] = rng.choice(["alert", "narrate"])
        for name, choices in (("threshold", [0, 0.0, 1, 1.0, 0.6, 0.5, -0.0, 0.999999]),
                              ("clear_threshold", [0, 0.4, 0.5, 1, 0.7, 1e-9])):
            if rng.random() < 0.4:
                spec[name] = rng.choice(choices)
        for name, choices in (("confirm", [1, 100, 3]), ("clear", [1, 100, 2]),
                              ("cooldown_s", [0, 0.0, 86_400, 86_400.0, 1e-300, 5]),
                              ("min_interval_s", [0, 86_400, 2.5]), ("report_checks", [True, False])):
            if rng.random() < 0.15:
                spec[name] = rng.choice(choices)
        if rng.random() < 0.1:
            spec["response"] = rng.choice([{}, {"max_tokens": 1}, {"max_tokens": MAX_TOKENS}, {"instructions": None},
                                           {"instructions": "i" * MAX_INSTRUCTIONS}, {"instructions": "Say 🚪."}])
        return spec

    def _unknown_fields(self) -> dict[str, Any]:
        """Fields the protocol does not have (ignored silently), of every JSON type."""
        return self.rng.choice([{"x": 1}, {"priority": "high"}, {"Threshold": "junk"}, {"": None},
                                {"nested": {"a": [1, {"b": None}]}}, {"event_id": "e1"}, {"watch": {}},
                                {"\U0001f600": True}, {"tags": list(range(50))}])

    def _bad_field(self) -> tuple[str, Any, str]:
        """One field with a wrong type or out of range: (field, value, what)."""
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            name = rng.choice(sorted(WRONG_TYPES))
            return name, rng.choice(WRONG_TYPES[name]), f"{name} wrong type"
        if r < 0.8:
            name = rng.choice(sorted(OUT_OF_RANGE))
            return name, rng.choice(OUT_OF_RANGE[name]), f"{name} out of range"
        return rng.choice([
            ("condition", "z" * rng.choice([MAX_CONDITION + 1, 20_000, 200_000]), "huge condition"),
            ("condition", "\U0001f534" * (MAX_CONDITION + 1), "condition of 1,001 emoji"),
            ("response", {"max_tokens": rng.choice([0, -1, MAX_TOKENS + 1, 10**6, "48", 48.0, [48]])}, "max_tokens"),
            ("response", {"instructions": rng.choice([5, [], "i" * (MAX_INSTRUCTIONS + 1)])}, "instructions"),
            ("response", {"instructions": {"deep": {"deeper": [{"deepest": []}]}}}, "nested instructions"),
            ("watch_id", rng.choice(BAD_IDS), "bad watch_id"),
        ])

    # ------------------------------------------------------------------ messages
    def next(self) -> list[WatchCase]:
        """The next few messages (a storm is several) and their answers."""
        rng = self.rng
        r = rng.random()
        ids = list(self.watches)
        if r < 0.18:
            cases = [self._create(self._spec(), "create", self._unknown_fields() if rng.random() < 0.2 else None)]
        elif r < 0.30:  # a create with one bad field: refused as it is parsed
            spec = self._spec()
            spec.setdefault("condition", "Is it red?")
            name, value, what = self._bad_field()
            spec[name] = value
            if name == "condition" and value is None:
                spec.pop("condition")
            cases = [WatchCase(dumps({"type": "watch.create", **spec}), "error:invalid_watch", READER, "create " + what)]
        elif r < 0.50:  # an update: of a watch held (most), deleted or never held
            target = rng.choice(ids) if ids and rng.random() < 0.8 else rng.choice(VALID_IDS)
            changes = {k: v for k, v in self._spec().items() if k != "watch_id"}
            if rng.random() < 0.5 and "condition" in changes:
                del changes["condition"]
            if rng.random() < 0.35:
                name, value, what = self._bad_field()
                if name != "watch_id":
                    changes[name] = value
                    cases = [self._update(target, changes, "update " + what, valid_types=False)]
                else:
                    cases = [self._update(target, changes, "update")]
            else:
                if rng.random() < 0.15:
                    changes.update(self._unknown_fields())
                cases = [self._update(target, changes, "update")]
        elif r < 0.59:
            target = rng.choice(ids) if ids and rng.random() < 0.6 else rng.choice(VALID_IDS + ["w99", "zz"])
            cases = [self._delete(target, "delete", self._unknown_fields() if rng.random() < 0.1 else None)]
        elif r < 0.68:  # storms: fill up and past max_watches; one id created and deleted over and over
            cases = self._storm()
        elif r < 0.80:
            cases = [self._surrogate()]
        elif r < 0.90:
            cases = [self._bad_envelope()]
        else:  # an update or delete whose target id is not a valid id
            kind = rng.choice(["watch.update", "watch.delete"])
            cases = [WatchCase(dumps({"type": kind, "watch_id": rng.choice(BAD_IDS), "threshold": 0.5}),
                               "error:invalid_message", READER, f"{kind} bad id")]
        for case in cases:
            self.counts[answer_kind(case.expected)] = self.counts.get(answer_kind(case.expected), 0) + 1
        return cases

    def _storm(self) -> list[WatchCase]:
        rng = self.rng
        r = rng.random()
        if r < 0.35:  # up to the limit and two past it, auto-named
            return [self._create({"condition": f"Is it {i}?"}, "fill")
                    for i in range(self.max_watches - len(self.watches) + 2)]
        if r < 0.55:  # the same id again and again
            return [self._create({"watch_id": "dup", "condition": "Is it a dup?"}, "duplicate") for _ in range(4)]
        if r < 0.75:  # create, delete, delete again, update the deleted one
            watch_id = rng.choice(["flip", "door", "w2"])
            return [self._create({"watch_id": watch_id, "condition": "Flip?"}, "create"),
                    self._delete(watch_id, "delete"), self._delete(watch_id, "delete again"),
                    self._update(watch_id, {"threshold": 0.9}, "update deleted")]
        return [self._delete(watch_id, "delete all") for watch_id in list(self.watches)]

    def _surrogate(self) -> WatchCase:
        """A lone surrogate somewhere in a watch message: the whole message is refused."""
        rng = self.rng
        s = rng.choice(SURROGATES)
        kind = rng.choice(["watch.create", "watch.update", "watch.delete"])
        msg: dict[str, Any] = {"type": kind, "watch_id": rng.choice(list(self.watches) or ["w1"]),
                               "condition": "Is it red?"}
        where = rng.choice(["condition", "watch_id", "key", "instructions", "list", "kind", "type"])
        if where == "type":
            msg["type"] = kind + s
        elif where == "key":
            msg[s] = 1
        elif where == "instructions":
            msg["response"] = {"instructions": s}
        elif where == "list":
            msg["tags"] = [1, {"a": [s]}]
        else:
            msg[where] = s
        return WatchCase(dumps(msg), "error:invalid_message", READER, f"{kind} surrogate in {where}")

    def _bad_envelope(self) -> WatchCase:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            text = rng.choice(['{"type": "watch.create", "condition": "x", "threshold": NaN}',
                               '{"type": "watch.update", "watch_id": "w1", "threshold": Infinity}',
                               '{"type": "watch.create", "cooldown_s": -Infinity, "condition": "x"}',
                               '{"type": "watch.create", "condition": "x"', '{"type": "watch.delete", watch_id: "w1"}',
                               '{"type": "watch.create", "condition": "\\ud800', "watch.create"])
            return WatchCase(text, "error:invalid_json", READER, "not JSON")
        if r < 0.6:
            kind = rng.choice(["watch", "watch.created", "watch.fired", "watch.Create", "watch.create ", "watches",
                               "watch.list", "_internal.watch"])
            return WatchCase(dumps({"type": kind, "condition": "Is it red?"}), "error:unknown_type", READER, "unknown type")
        value = rng.choice(['[{"type": "watch.create"}]', '"watch.create"', '{"type": ["watch.create"]}',
                            '{"type": null, "condition": "x"}', '{"condition": "x"}', "17", "null"])
        return WatchCase(value, "error:invalid_message", READER, "not a watch object")


# ---------------------------------------------------------------------- checking the answers


def is_interleaving(got: list[str], reader: list[str], turns: list[str]) -> bool:
    """True when ``got`` is ``reader`` and ``turns`` interleaved, each in its own order."""
    if len(got) != len(reader) + len(turns):
        return False
    # reachable[j]: after the answers so far, j of them from ``reader`` and the rest from ``turns``
    reachable = [True] + [False] * len(reader)
    for i, key in enumerate(got):
        step = [False] * (len(reader) + 1)
        for j in range(min(i, len(reader)) + 1):
            if not reachable[j]:
                continue
            if j < len(reader) and reader[j] == key:
                step[j + 1] = True
            k = i - j
            if k < len(turns) and turns[k] == key:
                step[j] = True
        reachable = step
        if not any(reachable):
            return False
    return reachable[len(reader)]


def answer_key(event: Any) -> str | None:
    """``WatchCase.expected``'s form of a server event; None for events that answer no message."""
    from handlers.wire.protocol import ErrorEvent, Pong, WatchCreated, WatchDeleted, WatchUpdated

    if isinstance(event, ErrorEvent):
        if event.closes_session:
            raise AssertionError(f"a watch message closed the session: {event}")
        return f"error:{event.code}"
    if isinstance(event, WatchCreated | WatchUpdated):
        return f"{event.type}:{event.watch['watch_id']}"
    if isinstance(event, WatchDeleted):
        return f"watch.deleted:{event.watch_id}"
    if isinstance(event, Pong):
        return "pong"
    return None


def explain(got: list[str], cases: list[WatchCase]) -> str:
    """Where ``got`` first leaves every interleaving of the two lanes (for the failure message)."""
    reader = [c for c in cases if c.lane == READER]
    turns = [c for c in cases if c.lane == TURNS]
    j = k = 0
    for i, key in enumerate(got):
        if j < len(reader) and reader[j].expected == key:
            j += 1
        elif k < len(turns) and turns[k].expected == key:
            k += 1
        else:
            heads = [lane[n] for lane, n in ((reader, j), (turns, k)) if n < len(lane)]
            return f"answer {i} is {key!r}; the next expected: {heads}"
    return f"{len(got)} answers for {len(cases)} messages"


async def send_watch_cases(conn: Any, cases: WatchCases, messages: int, batch: int = 250,
                           timeout: float = 60) -> int:
    """Send at least ``messages`` generated watch messages through ``conn`` (a ``Connection``
    with a session open), ``batch`` at a time with a ``ping`` after each batch, reading while
    sending; checks that the answers are exactly the expected ones, each lane in its order.
    Returns the number of watch messages sent. Raises ``AssertionError`` (a wrong, missing or
    extra answer) and ``TimeoutError``."""
    import asyncio

    sent = 0
    while sent < messages:
        chunk: list[WatchCase] = []
        while len(chunk) < min(batch, messages - sent):
            chunk.extend(cases.next())
        sent += len(chunk)
        chunk.append(WatchCase('{"type": "ping"}', "pong", READER, "ping"))

        async def send_all(chunk: list[WatchCase] = chunk) -> None:
            for case in chunk:
                await conn.send_raw(case.raw)

        async def receive_all(count: int = len(chunk)) -> list[str]:
            got: list[str] = []
            while len(got) < count:
                key = answer_key((await conn.receive(timeout)).event)
                if key is not None:
                    got.append(key)
            return got

        try:
            _, got = await asyncio.gather(send_all(), receive_all())
        except TimeoutError:
            raise AssertionError(f"answers lost: fewer than {len(chunk)} in {timeout} s for {chunk[:3]}...") from None
        reader = [c.expected for c in chunk if c.lane == READER]
        turns = [c.expected for c in chunk if c.lane == TURNS]
        if not is_interleaving(got, reader, turns):
            raise AssertionError(f"wrong answers: {explain(got, chunk)}")
    return sent
