"""Hostile clients through the real server (real socket, real engine on the tiny model):
2,000 generated messages of every kind, each answered as docs/protocol.md says, 10,000
watch events, each answered by its one documented code, and 2,000 realtime session.update
watch lists, each applied or refused whole as docs/realtime.md says, and hostile JSON on
every endpoint, each refused with v1's code; the session usable after,
nothing left behind (``livesight bench fuzz`` runs the same with 10,000 messages of every kind)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from handlers.wire.protocol import FrameAck, ResponseDone
from server.bench.footage import bench_frame
from server.app import LIVE_PATHS, REALTIME_PATH
from server.bench.fuzz_watch_lists import WatchLists
from server.bench.fuzz_watches import SURROGATES, WatchCases, send_watch_cases
from server.client.connection import Connection, StreamError

from server.background import RunningServer, run_server
from server.bench.fuzz import (
    FRAME,
    UNLIMITED_CONTROL,
    control_floods,
    fuzz,
    hostile_images,
    wait_for_clean_metrics,
)
from server.settings import Settings

EXAMPLES = 2_000
REALTIME_UPDATES = 2_000


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


WATCH_EVENTS = 10_000
#: The watches the storm's session starts with (in its session.config).
CONFIG_WATCHES: list[dict[str, Any]] = [
    {"watch_id": "door", "condition": "Is someone at the door?"},
    {"condition": "Is it red? \U0001f534", "threshold": 1, "clear_threshold": 1},
    {"kind": "narrate", "min_interval_s": 0, "report_checks": True},
]


def test_watch_events_get_their_one_documented_code(unlimited_server: RunningServer) -> None:
    """10,000 generated watch events (huge, blank, odd and surrogate conditions, every field of
    the wrong type or out of range, unknown fields, create/update/delete storms past
    max_watches over few ids) each get exactly the answer the docs give them, each lane in
    order; then the session pongs, acks frames and answers a question.

    The server's control budget is raised (``UNLIMITED_CONTROL``, Settings fields), so the
    storm is sent back to back, not paced: the parser and the watch book answer, not the budget.
    """
    cases = WatchCases(max_watches=8, rng=random.Random(20_240))
    cases.seed(CONFIG_WATCHES)

    async def storm() -> None:
        conn, ready = await Connection.open(unlimited_server.ws_url,
                                            {"sampling": {"max_tokens": 2, "seed": 0}, "watches": CONFIG_WATCHES})
        try:
            assert [w["watch_id"] for w in ready.event.config["watches"]] == ["door", "w1", "w2"]
            started = time.perf_counter()
            sent = await send_watch_cases(conn, cases, WATCH_EVENTS)
            seconds = time.perf_counter() - started
            print(f"watch events: {sent} in {seconds:.1f} s ({sent / seconds:.0f}/s); answers {sorted(cases.counts.items())}")
            assert sent >= WATCH_EVENTS
            await conn.ping()
            await conn.wait_for("pong", timeout=30)
            for n in range(3):  # the watches left are checked on these; every frame is still acked
                await conn.send_frame(bench_frame(n, (64, 48)), frame_id=f"after-{n}")
            acks = [e for e in await conn.receive_until(
                lambda e: isinstance(e, FrameAck) and e.frame_id == "after-2", timeout=60) if isinstance(e.event, FrameAck)]
            assert [a.event.frame_id for a in acks] == ["after-0", "after-1", "after-2"]
            await conn.query("What do you see?")
            done = await conn.wait_for(lambda e: isinstance(e, ResponseDone) and e.trigger is None, timeout=120)
            assert done.event.status == "completed"
        finally:
            await conn.close()

    asyncio.run(storm())
    counts = cases.counts
    for kind in ("watch.created", "watch.updated", "watch.deleted", "invalid_watch", "unknown_watch",
                 "too_many_watches", "invalid_message", "unknown_type", "invalid_json"):
        assert counts.get(kind, 0) >= 100, counts
    assert wait_for_clean_metrics(unlimited_server.http_url)["sessions"] == 0


def test_realtime_watch_lists_get_their_documented_answers(unlimited_server: RunningServer) -> None:
    """2,000 session.update events on /v1/realtime with generated watch lists (valid ones with
    odd Unicode, boundary values and ignored fields; a watch with a wrong type or out of range,
    inconsistent, an id twice, too many, not a list; lone surrogates, refused unread with one
    error naming no event): a valid list replaces
    the session's watches and session.updated echoes it; any other is refused whole, the
    session keeps its watches, session.updated lists it in livesight.refused and an error
    invalid_value names the event. The session then still answers a question over a frame."""
    lists = WatchLists(max_watches=8, rng=random.Random(20_241))
    url = f"ws://{unlimited_server.host}:{unlimited_server.port}{REALTIME_PATH}"

    async def receive(ws: Any) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(ws.recv(), 30))

    async def storm() -> None:
        async with websockets.connect(url, max_size=None) as ws:
            assert (await receive(ws))["type"] == "session.created"
            started = time.perf_counter()
            for _ in range(REALTIME_UPDATES):
                case = lists.next()
                await ws.send(case.raw)
                if case.unread:  # refused before it is read: one error naming no event
                    event = await receive(ws)
                    assert event["type"] == "error", (case, event)
                    assert (event["error"]["code"], event["error"].get("event_id")) == ("invalid_value", None), case
                    continue
                updated, errors = None, []
                while updated is None or (case.refused and not errors):
                    event = await receive(ws)
                    assert event["type"] in ("session.updated", "error"), (case, event)
                    if event["type"] == "error":
                        errors.append(event["error"])
                    else:
                        updated = event["session"]["livesight"]
                assert [w["watch_id"] for w in updated["watches"] or []] == case.watch_ids, (case, updated)
                assert bool(updated["refused"]) == case.refused, (case, updated["refused"])
                assert [(e["code"], e["event_id"]) for e in errors] == [("invalid_value", case.event_id)] * case.refused
            print(f"realtime watch lists: {REALTIME_UPDATES} in {time.perf_counter() - started:.1f} s; {lists.counts}")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": f"data:image/jpeg;base64,{bench_frame(1, (64, 48))}"}]}}))
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "livesight": {
                "watches": []}}}))  # no fired answer races the question
            await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 2}}))
            while (event := await receive(ws))["type"] != "response.done" or event["response"].get("metadata"):
                assert event["type"] != "error", event
            assert event["response"]["status"] in ("completed", "incomplete")

    asyncio.run(storm())
    assert lists.counts["applied"] >= 500 and lists.counts["refused"] >= 900 and lists.counts["unread"] >= 100, lists.counts
    assert wait_for_clean_metrics(unlimited_server.http_url)["sessions"] == 0


def test_hostile_json_gets_the_same_code_on_every_endpoint(unlimited_server: RunningServer) -> None:
    """NaN, a lone surrogate and nesting past 32 levels get v1's code on all three endpoints,
    each in its own envelope: v1 answers an error and goes on; Realtime too (invalid_message
    said as invalid_value, with no event_id: the message was not read); Live closes with 1007."""
    cases = {"NaN": "invalid_json", '"\\ud800"': "invalid_message", "[" * 40 + "]" * 40: "invalid_message"}
    host = f"ws://{unlimited_server.host}:{unlimited_server.port}"

    async def endpoints() -> None:
        conn, _ = await Connection.open(unlimited_server.ws_url, {})
        try:
            for value, code in cases.items():
                await conn.send_raw('{"type": "video.query", "text": ' + value + "}")
                assert (await conn.wait_for("error", timeout=30)).event.code == code, value
            await conn.ping()
            await conn.wait_for("pong", timeout=30)
        finally:
            await conn.close()
        async with websockets.connect(host + REALTIME_PATH, max_size=None) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "session.created"
            for value, code in cases.items():
                await ws.send('{"type": "input_audio_buffer.clear", "event_id": "e1", "x": ' + value + "}")
                error = json.loads(await asyncio.wait_for(ws.recv(), 30))["error"]
                assert error["code"] == (code if code == "invalid_json" else "invalid_value"), value
                assert "event_id" not in error
        for value in cases:
            async with websockets.connect(host + LIVE_PATHS[0], max_size=None) as ws:
                await ws.send(json.dumps({"setup": {"model": "m", "generationConfig": {"responseModalities": ["TEXT"]}}}))
                assert "setupComplete" in json.loads(await asyncio.wait_for(ws.recv(), 30))
                await ws.send('{"realtimeInput": {"text": ' + value + "}}")
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 30)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007, value

    asyncio.run(endpoints())
    assert wait_for_clean_metrics(unlimited_server.http_url)["sessions"] == 0


def test_watches_in_session_config_get_their_documented_answers(unlimited_server: RunningServer) -> None:
    """session.config's watches: valid ones (max_watches of them, odd Unicode, boundary values)
    are in session.ready; one too many, an inconsistent one, an id twice or a lone surrogate
    refuse the session with invalid_config; a second config with watches is invalid_message."""
    full = [{"condition": "Is it red? \U0001f534" * 60, "threshold": 0, "clear_threshold": 0, "cooldown_s": 86_400},
            {"watch_id": "a" * 64, "kind": "narrate", "confirm": 100, "clear": 100}]
    full += [{"condition": f"\u05d4 {n}?", "response": {"max_tokens": 4096}} for n in range(6)]
    refused = {
        "one too many": full + [{"condition": "Nine?"}],
        "clear above threshold": [{"condition": "x?", "threshold": 0.3}],
        "no condition": [{"kind": "alert"}],
        "blank condition": [{"condition": "\u3000"}],
        "over 1,000 characters": [{"condition": "y" * 1_001}],
        "an id twice": [{"watch_id": "d", "condition": "x?"}, {"watch_id": "d", "condition": "y?"}],
        "wrong type": [{"condition": "x?", "confirm": "2"}],
        "not an object": ["Is it red?"],
        "surrogate": [{"condition": SURROGATES[0]}],
    }

    async def sessions() -> None:
        conn, ready = await Connection.open(unlimited_server.ws_url, {"watches": full})
        try:
            assert [w["watch_id"] for w in ready.event.config["watches"]][:2] == ["w1", "a" * 64]
            assert len(ready.event.config["watches"]) == 8
            await conn.send_raw(json.dumps({"type": "session.config", "watches": [{"condition": "x?"}]}))
            assert (await conn.wait_for("error", timeout=30)).event.code == "invalid_message"
            await conn.ping()
            await conn.wait_for("pong", timeout=30)
        finally:
            await conn.close()
        for what, watches in refused.items():
            with pytest.raises(StreamError) as refusal:
                conn, _ = await Connection.open(unlimited_server.ws_url, {"watches": watches})
                await conn.close()
            assert refusal.value.code == "invalid_config", what

    asyncio.run(sessions())
    assert wait_for_clean_metrics(unlimited_server.http_url)["sessions"] == 0


def test_hostile_image_set_covers_the_kinds() -> None:
    """The generated images include each hostile kind the fuzz test promises."""
    names = set(hostile_images())
    for kind in ("bomb_png", "bomb_header_png", "wide_png", "tall_png", "cmyk_jpeg", "png_16bit", "apng",
                 "gif_animated"):
        assert kind in names
    assert "invalid_image" in FRAME
