"""Structured logs: every line of a session names it, every line about an answer names the answer."""

from __future__ import annotations

import io
import json
import logging

import pytest

from server.background import RunningServer
from server.logs import make_handler
from tests.protocol_client import connect

pytestmark = pytest.mark.anyio


async def test_json_lines_carry_session_and_request_ids(server: RunningServer) -> None:
    """Two sessions at once: each JSON line about one carries its session_id, answer lines its request_id."""
    out = io.StringIO()
    handler = make_handler("json", out)
    logger = logging.getLogger("livesight")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        clients = [await connect(server, sampling={"max_tokens": 3, "temperature": 0}, prefix_warmup=False) for _ in range(2)]
        done = {}
        for i, (client, ready) in enumerate(clients):
            await client.frame(f"f{i}", seed=40 + i)
        for client, ready in clients:
            done[ready["session_id"]] = (await client.ask("What?"))[-1]["request_id"]
        for client, _ in clients:
            await client.ws.close()
        await _wait_for(out, "session closed", 2)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    session_lines = [line for line in lines if line["logger"] == "livesight.session"]
    for session_id, request_id in done.items():
        mine = [line for line in session_lines if line.get("session_id") == session_id]
        messages = " | ".join(line["message"] for line in mine)
        assert "session opened" in messages and "session closed" in messages, messages
        answer_lines = [line for line in mine if request_id in line["message"]]
        assert answer_lines and all(line["request_id"] == request_id for line in answer_lines)
    assert all(line.get("session_id") for line in session_lines)  # no session line without its id
    assert all(set(line) >= {"ts", "level", "logger", "message"} for line in lines)


def test_text_lines_end_with_the_ids() -> None:
    """The text format appends [session=... request=...] to lines written inside a session."""
    from handlers.session import log_context

    out = io.StringIO()
    logger = logging.getLogger("livesight.test_text")
    logger.addHandler(make_handler("text", out))
    logger.setLevel(logging.INFO)
    logger.info("outside")
    s, r = log_context.session_id.set("abc123"), log_context.request_id.set("resp_abc_1")
    try:
        logger.info("inside")
    finally:
        log_context.request_id.reset(r)
        log_context.session_id.reset(s)
    first, second = out.getvalue().splitlines()
    assert first.endswith("livesight.test_text: outside")
    assert second.endswith("livesight.test_text: inside [session=abc123 request=resp_abc_1]")


async def _wait_for(out: io.StringIO, text: str, count: int, timeout_s: float = 30) -> None:
    import anyio

    with anyio.fail_after(timeout_s):
        while out.getvalue().count(text) < count:
            await anyio.sleep(0.05)
