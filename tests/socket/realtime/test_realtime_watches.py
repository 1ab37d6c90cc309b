"""A fired watch through /v1/realtime with the real openai SDK: watches set under
``session.livesight``, a fire arrives as a server-initiated response (``response.created`` ...
``response.done``) whose metadata names the watch, and every event parses strictly in the
SDK's typed models. A watch at threshold 0 holds on any frame, so the random-weight tiny model
fires it (that a watch fires on the right frame is tests/heavy/server/test_watch_colours.py)."""

from __future__ import annotations

import pytest

from server.background import RunningServer
from tests.socket.realtime.test_realtime import kinds, realtime

pytestmark = pytest.mark.anyio

ALWAYS = {"watch_id": "any", "condition": "Is there a picture?", "threshold": 0.0, "clear_threshold": 0.0}


async def test_a_fired_watch_is_a_server_initiated_response_in_the_sdks_models(server: RunningServer) -> None:
    """session.update with a watch, then an image: the server starts a response by itself,
    response.created and response.done carry metadata naming the watch, and no event outside
    the SDK's models is sent; a question after it gets a response with no such metadata."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                              "max_output_tokens": 4, "livesight": {"watches": [ALWAYS]}})
        session = (await rt.until("session.updated"))[-1]["session"]
        assert [w["watch_id"] for w in session["livesight"]["watches"]] == ["any"]
        await rt.add_image(5)
        fired = await rt.until("response.done")  # every event parsed in the SDK's models by rt.recv
        created = next(e for e in fired if e["type"] == "response.created")
        trigger = {"livesight_trigger": "watch", "watch_id": "any"}
        assert created["response"]["metadata"] == trigger
        assert fired[-1]["response"]["metadata"] == trigger
        assert fired[-1]["response"]["status"] in ("completed", "incomplete")  # incomplete: max_output_tokens
        assert kinds(fired).index("response.created") < kinds(fired).index("response.done")
        asked = await rt.ask("What is it?")
        assert not (asked[-1]["response"].get("metadata") or {}).get("livesight_trigger")
