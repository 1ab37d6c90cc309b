"""``livesight bench memory`` on one stream-minute: a ``livesight serve`` child on the shipped
colours model, its memory in SQLite in a temporary data dir; the figures it prints are sane."""

from __future__ import annotations

import tempfile
from pathlib import Path

from server.bench.memory import Scene, run_memory

MINUTE = [Scene("red", 10), Scene("blue", 10), Scene("green", 10), Scene("blue", 10), Scene("white", 10),
          Scene("grey", 10)]


def test_a_stream_minute_is_kept_small_found_by_condition_and_text_and_leaves_nothing_behind() -> None:
    """Six 10 s scenes at x50: keyframes stored (bytes > 0) at every scene change; "Is the screen
    blue?" finds the blue moments (recall and precision >= 0.9); text searches take time and
    find the answers; the range questions name their scene's colour; memory.clear empties the
    session and the bench's data dir is gone."""
    figures = run_memory(MINUTE, speed=50)
    assert [p.accepted for p in figures.offs + figures.ons] == [120] * 4
    assert len(figures.moments) >= len(MINUTE) and figures.moment_bytes > 0
    assert figures.usage_bytes >= figures.moment_bytes
    assert figures.truly_blue and figures.recall >= 0.9 and figures.precision >= 0.9
    assert figures.checked == len(figures.moments) and figures.skipped == 0
    assert len(figures.text_ms) > 1 and min(figures.text_ms) > 0 and max(figures.text_hits) > 0
    assert figures.range_asked == len(MINUTE) - 1 and figures.range_right >= figures.range_asked - 1
    assert figures.deleted >= len(figures.moments) and figures.usage_after_clear == 0
    assert len(figures.lines()) == 9
    assert list(Path(tempfile.gettempdir()).glob("livesight-bench-memory-*")) == []
