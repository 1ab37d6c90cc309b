"""Hostile clients: 2,000 generated messages through the real server, each answered as
docs/protocol.md says, the session usable after, nothing left behind (``livesight bench
fuzz`` runs the same with 10,000)."""

from __future__ import annotations

import pytest

from server.background import RunningServer
from server.bench.fuzz import FRAME, fuzz, hostile_images, wait_for_clean_metrics

EXAMPLES = 2_000


def test_hostile_messages_get_their_documented_answers(server: RunningServer) -> None:
    """Malformed and wrong-typed JSON, surrogates, huge values and hostile images (bombs,
    extreme aspect ratios, CMYK, 16-bit, animated, truncated) each get an ack or an error with
    a documented code; the session keeps answering pings and acking frames; after it closes,
    /metrics shows no session and no live frame."""
    stats = fuzz(server.ws_url, EXAMPLES)
    assert stats.messages >= EXAMPLES
    assert stats.errors.get("invalid_image", 0) > 0 and stats.errors.get("invalid_message", 0) > 0
    assert "internal_error" not in stats.errors and "engine_error" not in stats.errors
    print(f"fuzz: {stats.messages} messages in {stats.seconds:.1f} s; errors {stats.errors}")
    metrics = wait_for_clean_metrics(server.http_url)
    assert metrics["frames_live"] == 0 and metrics["sessions"] == 0


def test_hostile_image_set_covers_the_kinds() -> None:
    """The generated images include each hostile kind the fuzz test promises."""
    names = set(hostile_images())
    for kind in ("bomb_png", "bomb_header_png", "wide_png", "tall_png", "cmyk_jpeg", "png_16bit", "apng",
                 "gif_animated"):
        assert kind in names
    assert "invalid_image" in FRAME
