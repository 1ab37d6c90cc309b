"""Watches through the real server and the real transformers engine on the tiny model: the
check runs on the warm prefix, a fire is answered with its trigger, the follow-up is warm.
(That a watch fires on the right frame needs a model that can see: tests/models.)"""

from __future__ import annotations

import httpx
import pytest

from server.background import RunningServer
from tests.protocol_client import connect

pytestmark = pytest.mark.anyio


async def test_a_watch_that_always_holds_fires_once_and_its_follow_up_is_warm(server: RunningServer) -> None:
    """A watch at threshold 0 (true at any probability): the first check fires it, watch.fired
    names the frame and comes before its answer, whose response.start and response.done carry
    the trigger; a second frame fires nothing (it waits to be cleared); the question after it
    is served from the warm prefix (most of its prompt cached); /metrics.json and /metrics
    count the checks and the fire."""
    watch = {"watch_id": "any", "condition": "Is there a picture?", "threshold": 0.0, "clear_threshold": 0.0,
             "report_checks": True}
    client, ready = await connect(server, sampling={"max_tokens": 4}, watches=[watch])
    try:
        assert ready["config"]["watches"][0]["watch_id"] == "any"
        assert ready["capabilities"]["token_probabilities"] is True
        await client.frame(1, seed=31)
        events = await client.collect_until("response.done")
        kinds = [e["type"] for e in events]
        fired = next(e for e in events if e["type"] == "watch.fired")
        assert fired["frame_id"] == 1 and fired["decision_ms"] is not None
        assert kinds.index("watch.check") < kinds.index("watch.fired") < kinds.index("response.start")
        start = next(e for e in events if e["type"] == "response.start")
        assert start["trigger"] == {"type": "watch", "watch_id": "any"}
        assert events[-1]["trigger"] == {"type": "watch", "watch_id": "any"}
        assert events[-1]["status"] == "completed"
        await client.frame(2, seed=32)
        check = await client.recv_type("watch.check")
        assert check["frame_id"] == 2 and 0.0 <= check["probability"] <= 1.0
        follow_up = await client.ask("What did you see?")
        done = follow_up[-1]
        assert done["trigger"] is None and not [e for e in follow_up if e["type"] == "watch.fired"]
        assert done["usage"]["cached_tokens"] >= 0.9 * done["usage"]["prompt_tokens"], done["usage"]
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            counts = (await http.get("/metrics.json")).json()["watches"]
            prometheus = (await http.get("/metrics")).text
        assert counts["checks"] >= 2 and counts["fires"] >= 1 and counts["skipped"] >= 0, counts
        assert "livesight_watch_fires_total" in prometheus and "livesight_watch_checks_skipped_total" in prometheus
    finally:
        await client.ws.close()
