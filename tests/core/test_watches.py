"""Watches' decisions as pure code (``handlers/core/watches.py``): debouncing, hysteresis,
cooldown, narrate's minimum interval and silence, create/update/delete and their errors."""

from __future__ import annotations

import pytest

from handlers.core.events import WatchCleared, WatchFired
from handlers.core.frames import Frame
from handlers.core.watches import WatchBook, check_question, fire_question
from handlers.wire.errors import SessionError
from handlers.wire.protocol import WatchSpec


def frame(seq: int) -> Frame:
    return Frame(seq=seq, key=f"k{seq}", data=b"x", receive_ts_ms=1000.0 + seq, frame_id=seq, pts_ms=seq * 500.0)


def run(book: WatchBook, probabilities: list[float], watch_id: str = "w1", step_s: float = 0.5) -> list[str]:
    """Feed one probability per frame; returns what happened at each ('fire', 'clear' or '')."""
    out = []
    for i, p in enumerate(probabilities):
        decided = book.record([(watch_id, p, 1.0)], frame(i), now_s=i * step_s)
        kinds = {type(e) for e in decided.events}
        out.append("fire" if WatchFired in kinds else "clear" if WatchCleared in kinds else "")
    return out


def alert(**fields) -> WatchBook:
    book = WatchBook(max_watches=4)
    book.create(WatchSpec(watch_id="w1", condition="Is the screen red?", **fields))
    return book


def test_an_alert_fires_once_when_the_condition_becomes_true() -> None:
    """Grey, red, red, red: one fire on the first red frame (confirm 1), none while it stays true."""
    assert run(alert(), [0.1, 0.9, 0.95, 0.9]) == ["", "fire", "", ""]


def test_confirm_needs_checks_in_a_row() -> None:
    """With confirm 2, a single high check does not fire; two in a row do."""
    assert run(alert(confirm=2), [0.9, 0.1, 0.9, 0.9, 0.9]) == ["", "", "", "fire", ""]


def test_hysteresis_between_the_thresholds_changes_nothing() -> None:
    """Values between clear_threshold and threshold neither fire nor clear."""
    book = alert(threshold=0.7, clear_threshold=0.3, clear=1, cooldown_s=0)
    assert run(book, [0.5, 0.69, 0.8, 0.5, 0.31, 0.6, 0.2, 0.5, 0.75]) == ["", "", "fire", "", "", "", "clear", "", "fire"]


def test_clear_rearms_after_clear_checks_in_a_row() -> None:
    """After a fire, ``clear`` low checks in a row re-arm it (watch.cleared); a lone low one does not."""
    book = alert(clear=2, cooldown_s=0)
    assert run(book, [0.9, 0.1, 0.9, 0.1, 0.1, 0.9]) == ["fire", "", "", "", "clear", "fire"]


def test_cooldown_holds_a_second_fire_until_it_is_over() -> None:
    """Re-armed within the cooldown, a true condition fires only once the cooldown is over."""
    book = alert(clear=1, cooldown_s=3)  # checks every 0.5 s
    got = run(book, [0.9, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
    assert got == ["fire", "clear", "", "", "", "", "fire", ""]


def test_narrate_fires_at_most_every_min_interval_and_is_silent_otherwise() -> None:
    """A narrate watch fires whenever the scene changed, no more often than min_interval_s,
    needs no re-arming, and says nothing while nothing changed."""
    book = WatchBook(max_watches=4)
    book.create(WatchSpec(watch_id="n", kind="narrate", min_interval_s=1.0))
    got = run(book, [0.9, 0.9, 0.9, 0.1, 0.1, 0.9, 0.1], watch_id="n")
    assert got == ["fire", "", "fire", "", "", "fire", ""]


def test_fired_event_names_the_frame_and_the_decision_time() -> None:
    """watch.fired carries the frame's id and pts, the probability and the decision time given."""
    book = alert()
    decided = book.record([("w1", 0.87654, 3.0)], frame(7), now_s=1.0, decision_ms=42.5)
    fired = decided.events[0]
    assert isinstance(fired, WatchFired)
    assert (fired.frame_id, fired.pts_ms, fired.probability, fired.decision_ms) == (7, 3500.0, 0.8765, 42.5)
    assert decided.fires[0].question == fire_question(book.get("w1").spec)


def test_report_checks_sends_every_check() -> None:
    """report_checks: one watch.check per check, with its probability and time."""
    book = alert(report_checks=True)
    decided = book.record([("w1", 0.2, 12.345)], frame(1), now_s=0.0)
    assert [type(e).__name__ for e in decided.events] == ["WatchChecked"]
    assert decided.events[0].ms == 12.35


def test_a_watch_deleted_during_a_check_is_passed_over() -> None:
    """Results for a watch deleted while its check ran change nothing and send nothing."""
    book = alert()
    book.delete("w1")
    assert book.record([("w1", 0.99, 1.0)], frame(1), now_s=0.0).events == []


def test_create_update_delete_and_their_errors() -> None:
    """Ids are given or made; too many, a duplicate id, an unknown id and a bad update are refused."""
    book = WatchBook(max_watches=2)
    assert book.create(WatchSpec(condition="Is it dark?")).watch["watch_id"] == "w1"
    book.create(WatchSpec(watch_id="door", condition="Is the door open?"))
    with pytest.raises(SessionError) as too_many:
        book.create(WatchSpec(condition="x?"))
    assert too_many.value.code == "too_many_watches"
    with pytest.raises(SessionError) as unknown:
        book.delete("nope")
    assert unknown.value.code == "unknown_watch"
    with pytest.raises(SessionError) as bad:
        book.update("door", {"threshold": 2.0})
    assert bad.value.code == "invalid_watch"
    updated = book.update("door", {"threshold": 0.8})
    assert updated.watch["threshold"] == 0.8 and updated.watch["condition"] == "Is the door open?"
    book.delete("door")
    with pytest.raises(SessionError) as duplicate:
        book.create(WatchSpec(watch_id="w1", condition="again?"))
    assert duplicate.value.code == "invalid_watch"


def test_a_config_list_with_an_id_twice_is_refused_as_such() -> None:
    """A list (session.config, a Realtime session.update) naming one id twice says so, and
    one past max_watches is too many."""
    specs = [WatchSpec(watch_id="d", condition="x?"), WatchSpec(watch_id="d", condition="y?")]
    with pytest.raises(SessionError) as twice:
        WatchBook.of(specs, max_watches=8)
    assert twice.value.code == "invalid_watch" and "twice" in twice.value.message
    with pytest.raises(SessionError) as many:
        WatchBook.of([WatchSpec(condition=f"{i}?") for i in range(3)], max_watches=2)
    assert many.value.code == "too_many_watches"
    assert [w.spec.watch_id for w in WatchBook.of(specs[:1], max_watches=8)] == ["d"]


def test_update_keeps_the_state_unless_the_condition_changes() -> None:
    """Changing a threshold keeps a fired alert fired; a new condition starts it afresh."""
    book = alert()
    run(book, [0.9])
    book.update("w1", {"threshold": 0.7})
    assert not book.get("w1").armed
    book.update("w1", {"condition": "Is the screen blue?"})
    assert book.get("w1").armed


def test_check_question_is_the_condition_as_written() -> None:
    """The check's question is the condition, stripped; narrate's default when it has none."""
    assert check_question(WatchSpec(condition="  Is the screen red? ")) == "Is the screen red?"
    assert check_question(WatchSpec(kind="narrate")).startswith("Has something changed")
