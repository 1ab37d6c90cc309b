"""When watch checks run and how skipped frames are counted (``handlers/core/check_schedule.py``), alone."""

from __future__ import annotations

from handlers.core.check_schedule import CheckSchedule


def test_a_round_is_due_after_a_new_frame_at_most_every_interval() -> None:
    """Nothing new: no round; a new frame: a round now, then the next only after the interval."""
    rounds = CheckSchedule(0.25)
    assert rounds.due(0.0) is None
    rounds.frame_accepted()
    assert rounds.due(0.0) == 0.0
    rounds.started(0.0)
    assert rounds.due(0.1) is None  # nothing new since it started
    rounds.frame_accepted()
    assert rounds.due(0.1) == 0.15
    assert rounds.due(0.3) == 0.0


def test_frames_overtaken_before_any_round_are_told_once() -> None:
    """Two frames before a round: the first was skipped, told with that round's end, then not again."""
    rounds = CheckSchedule(0.25)
    rounds.frame_accepted()
    rounds.frame_accepted()
    rounds.started(1.0)
    assert rounds.ended(True) == 1
    assert rounds.ended(True) == 0


def test_a_round_stopped_by_a_question_checks_its_frame_again() -> None:
    """A round a question stopped leaves its frame unchecked: another round is due, nothing is counted skipped."""
    rounds = CheckSchedule(0.0)
    rounds.frame_accepted()
    rounds.started(1.0)
    assert rounds.ended(False) == 0
    assert rounds.due(1.0) == 0.0


def test_the_end_tells_the_unchecked_newest_frame_only_while_watching() -> None:
    """At the session's end the newest unchecked frame counts as skipped when the session still has watches."""
    rounds = CheckSchedule(0.25)
    rounds.frame_accepted()
    assert rounds.told_at_end(True) == 1 and rounds.told_at_end(True) == 0
    rounds.frame_accepted()
    assert rounds.told_at_end(False) == 0
