"""When a session's watches are checked, and how many accepted frames went unchecked.

A round of checks is wanted after an accepted frame (the similarity filter already dropped
unchanged scenes) and runs at most every ``min_check_interval_ms``; a frame that came while
the model was busy and was overtaken by a newer one before any round looked at it is a
skipped check, counted and told with the next round (or at the session's end), never queued.
Pure: times are passed in (seconds on the caller's monotonic clock).
"""

from __future__ import annotations


#: Accepted frames left unchecked, one after another, after which a round goes before the
#: session's next prefill (it warms what it adds itself): with more sessions than the model
#: keeps up with, every prefill would find a newer frame and the checks would never run.
OVERDUE_FRAMES = 2


class CheckSchedule:
    """One session's check rounds: ``due`` says when the next may run; ``started`` and
    ``ended`` bracket each; ``skipped`` counts the frames no round looked at."""

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self._unchecked = False  # an accepted frame no round has looked at
        self._skipped = 0  # accepted frames no round looked at, not yet told
        self._last_s: float | None = None  # when the last round started

    def frame_accepted(self) -> None:
        """An accepted frame (the session has watches): a round has something new to look at."""
        if self._unchecked:
            self._skipped += 1  # the previous new frame got no round of its own
        self._unchecked = True

    def due(self, now_s: float) -> float | None:
        """None when nothing new came since the last round; else the seconds to wait before
        one may run (0: now)."""
        if not self._unchecked:
            return None
        if self._last_s is None:
            return 0.0
        return max(0.0, self._last_s + self.min_interval_s - now_s)

    @property
    def overdue(self) -> bool:
        """True when ``OVERDUE_FRAMES`` accepted frames in a row went unchecked and another waits."""
        return self._unchecked and self._skipped >= OVERDUE_FRAMES

    def started(self, now_s: float) -> None:
        """A round starts over the newest frame."""
        self._unchecked = False
        self._last_s = now_s

    def ended(self, completed: bool) -> int:
        """A round ended; returns the skipped frames to tell with it (the count starts again).
        One stopped before its end (a question came) leaves its frame to be checked again."""
        if not completed:
            self._unchecked = True
        skipped, self._skipped = self._skipped, 0
        return skipped

    def told_at_end(self, watching: bool) -> int:
        """The skipped frames not told yet, the newest too if still unchecked while the
        session has watches (the session's end tells them); told once: the count starts again
        from zero."""
        skipped = self._skipped + (1 if self._unchecked and watching else 0)
        self._skipped, self._unchecked = 0, False
        return skipped
