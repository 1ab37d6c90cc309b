"""Hostile clients: 2,000 generated messages through the real server, each answered as
docs/protocol.md says, the session usable after, nothing left behind (``livesight bench
fuzz`` runs the same with 10,000)."""

from __future__ import annotations

import pytest

from collections.abc import Iterator
from pathlib import Path

from server.background import RunningServer, run_server
from server.bench.fuzz import (
    FRAME,
    UNLIMITED_CONTROL,
    control_floods,
    fuzz,
    hostile_images,
    wait_for_clean_metrics,
    watch_storm,
)
from server.settings import Settings

EXAMPLES = 2_000


@pytest.fixture(scope="module")
def unlimited_server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """A server whose control budget never refuses: the parser, not the budget, answers."""
    with run_server(Settings(model=str(tiny_model_dir), resume_grace_s=0, **UNLIMITED_CONTROL)) as running:
        yield running


def test_control_storms_get_documented_answers_or_rate_limited(server: RunningServer) -> None:
    """Storms of 250-400 control messages back to back (pings, questions, cancels, junk, second
    configs) at the default budget: each answer is documented or ``rate_limited`` (with
    ``retry_after_ms``, not one per message), the session stays open and pongs after a quiet
    second; nothing is left after it closes."""
    stats = control_floods(server.ws_url, storms=4)
    assert stats.storms == 4 and stats.rate_limited >= 4
    assert stats.pongs >= 4
    print(f"floods: {stats}")
    metrics = wait_for_clean_metrics(server.http_url)
    assert metrics["frames_live"] == 0 and metrics["sessions"] == 0


def test_hostile_messages_get_their_documented_answers(unlimited_server: RunningServer) -> None:
    """Malformed and wrong-typed JSON, surrogates, huge values and hostile images (bombs,
    extreme aspect ratios, CMYK, 16-bit, animated, truncated) each get an ack or an error with
    a documented code; the session keeps answering pings and acking frames; after it closes,
    /metrics shows no session and no live frame."""
    server = unlimited_server
    stats = fuzz(server.ws_url, EXAMPLES)
    assert stats.messages >= EXAMPLES
    assert stats.errors.get("invalid_image", 0) > 0 and stats.errors.get("invalid_message", 0) > 0
    assert "internal_error" not in stats.errors and "engine_error" not in stats.errors
    print(f"fuzz: {stats.messages} messages in {stats.seconds:.1f} s; errors {stats.errors}")
    metrics = wait_for_clean_metrics(server.http_url)
    assert metrics["frames_live"] == 0 and metrics["sessions"] == 0


def test_watch_storms_get_one_documented_answer_each(unlimited_server: RunningServer) -> None:
    """2,000 generated watch messages (huge, blank and surrogate conditions, wrong types, create
    and delete storms over a few ids) a hundred at a time: each gets exactly one answer, its
    watch event or a documented error, and the session still pongs."""
    answers = watch_storm(unlimited_server.ws_url, 2_000)
    assert sum(answers.values()) == 2_000
    assert answers.get("watch.created", 0) > 0 and answers.get("invalid_message", 0) > 0
    assert answers.get("unknown_watch", 0) + answers.get("too_many_watches", 0) > 0, answers
    print(f"watch storm: {answers}")
    assert wait_for_clean_metrics(unlimited_server.http_url)["sessions"] == 0


def test_hostile_image_set_covers_the_kinds() -> None:
    """The generated images include each hostile kind the fuzz test promises."""
    names = set(hostile_images())
    for kind in ("bomb_png", "bomb_header_png", "wide_png", "tall_png", "cmyk_jpeg", "png_16bit", "apng",
                 "gif_animated"):
        assert kind in names
    assert "invalid_image" in FRAME
