"""Warm prefix over the wire: identical greedy answers with and without it, and cached tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.background import RunningServer, run_server
from server.settings import Settings
from server.models.tiny import make_tiny_model
from tests.protocol_client import connect

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sharp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server on a sharp tiny Qwen2.5-VL, where any position mistake changes greedy tokens."""
    model = make_tiny_model(Path(tmp_path_factory.mktemp("sharp")), family="qwen2_5_vl", init_std=0.3)
    with run_server(Settings(model=str(model))) as running:
        yield running


async def _settle(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for _ in range(2000):
            if not (await http.get("/metrics.json")).json()["sessions_busy"]:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("server did not settle")


async def _conversation(server: RunningServer, warm: bool) -> list[dict]:
    """Three frames, two questions, one more frame, a third question; returns the response.done events
    with their text."""
    client, ready = await connect(server, prefix_warmup=warm, enable_frame_filter=False, num_frames=8,
                                  sampling={"temperature": 0, "max_tokens": 16})
    assert ready["capabilities"]["prefix_warmup_active"] is warm
    out = []
    for i in range(3):
        await client.frame(f"f{i}", seed=40 + i, pts_ms=i * 500)
    for question, extra_frame in (("What is here?", False), ("And the colour?", True), ("Anything new?", False)):
        if extra_frame:
            await client.frame("f3", seed=77, pts_ms=1500)
        await _settle(server)
        events = await client.ask(question)
        done = events[-1]
        done["text"] = next(e for e in events if e["type"] == "response.text.done")["text"]
        out.append(done)
    await client.ws.close()
    return out


async def test_warm_and_cold_answers_are_identical(sharp_server: RunningServer) -> None:
    """Greedy answers are the same with prefix_warmup on and off; only the cache use differs."""
    warm = await _conversation(sharp_server, warm=True)
    cold = await _conversation(sharp_server, warm=False)
    assert [d["text"] for d in warm] == [d["text"] for d in cold]
    assert [d["usage"]["completion_tokens"] for d in warm] == [d["usage"]["completion_tokens"] for d in cold]
    assert [d["usage"]["prompt_tokens"] for d in warm] == [d["usage"]["prompt_tokens"] for d in cold]
    for done in warm:
        # everything but the question (and the re-computed last token) came from the warm prefix
        assert done["usage"]["cached_tokens"] > done["usage"]["prompt_tokens"] * 0.8
    assert cold[0]["usage"]["cached_tokens"] == 0


async def test_follow_up_right_after_an_answer_is_served_from_the_cache(sharp_server: RunningServer) -> None:
    """A follow-up asked the moment an answer ends finds at least 95% of its prompt cached,
    and a question after new frames too: the answer joins the timeline after the frames."""
    client, _ = await connect(sharp_server, enable_frame_filter=False, sampling={"temperature": 0, "max_tokens": 8})
    for i in range(12):
        await client.frame(f"g{i}", seed=140 + i, pts_ms=i * 500)
    await _settle(sharp_server)
    first = (await client.ask("What is here?"))[-1]
    follow = (await client.ask("And on the left?"))[-1]  # no waiting: right after response.done
    again = (await client.ask("And the right?"))[-1]
    await client.frame("g12", seed=200, pts_ms=6000)
    await _settle(sharp_server)
    later = (await client.ask("What is new?"))[-1]
    for done in (first, follow, again, later):
        assert done["status"] == "completed"
        assert done["usage"]["cached_tokens"] >= 0.95 * done["usage"]["prompt_tokens"], done["usage"]
    assert follow["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    await client.ws.close()
