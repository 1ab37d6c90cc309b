"""How much control traffic one session may send: token buckets, pure and clock-driven.

Media (frames, microphone audio) is bounded by bytes and shed under load (``intake.py``);
everything else a client sends (``ping``, questions, cancels, config updates, conversation
items, and messages that do not parse) is control, and each costs the event loop a turn and
usually an answer on the wire. ``ControlBudget`` gives each session two buckets:

- every control message takes a token of ``rate_per_s`` (``burst`` at most saved up);
- a message that starts or stops an answer (a question, ``response.create``, a cancel) also
  takes one of ``answer_rate_per_s`` (``answer_burst``), since each moves the engine.

A refused message is not handled. The first refusal of an episode is answered with one
``rate_limited`` error naming when the client may send again; further refusals of the
episode are dropped without a reply (a flood must not be answered by a flood, and some
clients stop at any error), and after each
refusal the adapter reads nothing more from that client until a token is back
(``wait_s``), so a flood costs the server about twice the rate, whatever the client sends. An episode ends
once a second passes with no refusal; a client still being refused ``close_after_s`` into an
episode is closed (``too_many_messages``). Real clients stay far below the defaults: a
browser pings every 20 s, LiveKit sends a few events per user turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from handlers.wire.errors import ErrorCode, SessionError

QUIET_S = 1.0  # a second without a refusal ends an episode


@dataclass(frozen=True, slots=True)
class ControlLimits:
    """Per-session control traffic limits (defaults match ``Settings``)."""

    rate_per_s: float = 50.0
    burst: int = 100
    answer_rate_per_s: float = 10.0
    answer_burst: int = 20
    close_after_s: float = 10.0


class Verdict(Enum):
    TAKE = "take"  # handle the message
    TELL = "tell"  # refuse it and send ``rate_limited`` (the first refusal of a while)
    DROP = "drop"  # refuse it silently (the client was told)
    CLOSE = "close"  # refuse it and close the session (``too_many_messages``)


class _Bucket:
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.capacity = float(max(1, burst))
        self.tokens = self.capacity
        self.at: float | None = None  # no refill yet: the clock's origin is never assumed

    def refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self) -> float:
        """Seconds until one token is there (0 when it is)."""
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate if self.rate > 0 else math.inf


class ControlBudget:
    """One session's control budget; ``check`` is called once per control message with the
    current time in seconds (any monotonic clock)."""

    def __init__(self, limits: ControlLimits) -> None:
        self.limits = limits
        self._all = _Bucket(limits.rate_per_s, limits.burst)
        self._answers = _Bucket(limits.answer_rate_per_s, limits.answer_burst)
        self._episode: float | None = None  # when the current run of refusals began
        self._last_refusal: float | None = None
        self._told = False  # this episode's one notice was sent
        self.refused = 0
        self.retry_after_s = 0.0  # of the last TELL

    def check(self, now: float, moves_answer: bool = False) -> Verdict:
        """Take a token for one control message (and an answer token when ``moves_answer``)."""
        self._all.refill(now)
        self._answers.refill(now)
        if self._last_refusal is not None and now - self._last_refusal >= QUIET_S:
            self._episode = None
            self._told = False
        buckets = (self._all, self._answers) if moves_answer else (self._all,)
        if all(b.tokens >= 1 for b in buckets):
            for b in buckets:
                b.tokens -= 1
            return Verdict.TAKE
        self.refused += 1
        self._last_refusal = now
        if self._episode is None:
            self._episode = now
        if now - self._episode >= self.limits.close_after_s:
            return Verdict.CLOSE
        if self._told:
            return Verdict.DROP
        self.retry_after_s = max(b.wait_s() for b in buckets)
        self._told = True
        return Verdict.TELL

    def wait_s(self, moves_answer: bool = False) -> float:
        """Seconds until a message (an answer move with ``moves_answer``) would be taken, as of
        the last ``check``."""
        buckets = (self._all, self._answers) if moves_answer else (self._all,)
        return max(b.wait_s() for b in buckets)

    def refusal(self, verdict: Verdict) -> SessionError | None:
        """What a refused message is answered with: ``rate_limited`` once per episode (naming
        when to send again), ``too_many_messages`` (the session closes) for a client that kept
        flooding, else nothing."""
        if verdict is Verdict.TELL:
            wait_ms = max(1, round(self.retry_after_s * 1000))
            return SessionError(
                ErrorCode.RATE_LIMITED,
                f"too many control messages; this one was dropped. Send again in {wait_ms} ms "
                "(messages sent before then are dropped without a reply)",
                retry_after_ms=wait_ms,
            )
        if verdict is Verdict.CLOSE:
            return SessionError(
                ErrorCode.TOO_MANY_MESSAGES,
                f"control messages over the limit for {self.limits.close_after_s:g} s; closing",
            )
        return None
