"""Sessions over a real socket that every vLLM-backed engine must pass (engine=vllm, engine=openai).

Each scenario uses its own frame seeds, so no scenario finds another's frames in the
engine's prefix cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from server.background import RunningServer
from tests.protocol_client import connect

IMAGE_TOKENS = 256  # the tiny Idefics3's tokens per frame (plus 3 markers)
LONG_QUESTION = "the " * 4900  # ~4,900 tokens: over the test engines' max_model_len of 4096


async def livesight_metrics(server: RunningServer) -> dict:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return (await http.get("/metrics.json")).json()


async def settle(server: RunningServer, timeout_s: float = 60) -> None:
    """Wait until no session has a decode, warmup or answer running."""
    deadline = time.monotonic() + timeout_s
    while (await livesight_metrics(server))["sessions_busy"]:
        if time.monotonic() > deadline:
            raise AssertionError("the server did not settle")
        await asyncio.sleep(0.02)


async def no_sessions(server: RunningServer, timeout_s: float = 60) -> None:
    """Wait until earlier tests' sessions (and their warmups) have ended on the server."""
    deadline = time.monotonic() + timeout_s
    while (await livesight_metrics(server))["sessions"]:
        if time.monotonic() > deadline:
            raise AssertionError("sessions were left open")
        await asyncio.sleep(0.02)


def _kinds(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


async def streams_answer(server: RunningServer, engine_name: str) -> None:
    client, ready = await connect(server, sampling={"max_tokens": 16, "temperature": 0}, enable_frame_filter=False)
    assert ready["capabilities"]["name"] == engine_name and ready["capabilities"]["warm_prefix"] is True
    await client.frame("a", seed=501, pts_ms=0)
    await client.frame("b", seed=502, pts_ms=500)
    events = await client.ask("What is in the picture?")
    kinds = _kinds(events)
    assert kinds[0] == "response.start" and kinds[1] == "video.frames.consumed", kinds
    assert "response.text.delta" in kinds and kinds[-2:] == ["response.text.done", "response.done"], kinds
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    assert deltas and events[-2]["text"] == deltas
    done = events[-1]
    assert done["status"] == "completed" and done["finish_reason"] in {"stop", "length"}
    assert done["usage"]["prompt_tokens"] > 2 * IMAGE_TOKENS
    assert 0 < done["usage"]["completion_tokens"] <= 16
    usage = done["usage"]
    assert usage["text_tokens"] + usage["image_tokens"] + usage["audio_tokens"] == usage["prompt_tokens"]
    if engine_name == "openai":  # vLLM's server does not report image tokens: estimated
        assert abs(usage["image_tokens"] - 2 * IMAGE_TOKENS) <= 0.1 * 2 * IMAGE_TOKENS, usage
    else:
        assert usage["image_tokens"] == 2 * IMAGE_TOKENS, usage
    assert done["timings"]["ttft_ms"] is not None
    assert events[1]["frame_ids"] == ["a", "b"]
    await client.ws.close()


async def repeated_query_hits_cache(server: RunningServer) -> None:
    client, _ = await connect(server, enable_frame_filter=False, sampling={"max_tokens": 4, "temperature": 0})
    await client.frame("c", seed=511)
    await client.frame("d", seed=512)
    first = (await client.ask("Describe the scene."))[-1]
    # The answer joins the timeline after the frames, so the frames stay cached.
    await settle(server)
    second = (await client.ask("Describe the scene."))[-1]
    assert first["status"] == second["status"] == "completed"
    # Cache hits come in whole blocks (128 tokens on CPU): the two frames alone are 4 of them.
    assert second["usage"]["cached_tokens"] >= 2 * IMAGE_TOKENS, (first["usage"], second["usage"])
    await client.ws.close()


async def follow_up_hits_cache(server: RunningServer) -> None:
    client, _ = await connect(server, enable_frame_filter=False, sampling={"max_tokens": 4, "temperature": 0})
    for i in range(8):
        await client.frame(f"t{i}", seed=531 + i, pts_ms=i * 500)
    await settle(server)
    first = (await client.ask("What is in the picture?"))[-1]
    follow = (await client.ask("And on the left?"))[-1]  # the moment the answer ends
    assert first["status"] == follow["status"] == "completed"
    usage = follow["usage"]
    # hits come in whole 128-token blocks: everything up to the answer is one run of them
    assert usage["cached_tokens"] >= 0.9 * usage["prompt_tokens"], (first["usage"], usage)
    await client.ws.close()


async def warmup_caches_prefix(server: RunningServer) -> None:
    client, ready = await connect(server, enable_frame_filter=False, sampling={"max_tokens": 4, "temperature": 0})
    assert ready["capabilities"]["prefix_warmup_active"] is True
    for i in range(3):
        await client.frame(f"w{i}", seed=521 + i, pts_ms=i * 500)
    await settle(server)
    done = (await client.ask("What changed?"))[-1]
    assert done["status"] == "completed"
    assert done["usage"]["cached_tokens"] >= 3 * IMAGE_TOKENS, done["usage"]
    await client.ws.close()


async def interrupt_leaves_no_request(
    server: RunningServer, engine_running: Callable[[], Awaitable[int]] | None = None
) -> None:
    await no_sessions(server)  # so the only engine request is this answer
    # 3,000 tokens take seconds on this CPU: the cancel lands while the answer runs.
    client, _ = await connect(
        server, prefix_warmup=False, sampling={"max_tokens": 3000, "temperature": 1.0, "seed": 7}
    )
    await client.frame("e", seed=531)
    await client.send(type="video.query", text="Tell a long story about this picture.")
    start = await client.recv_type("response.start")
    await client.recv_type("response.text.delta")
    await client.send(type="response.cancel")
    done = await client.recv_type("response.done")
    assert done["request_id"] == start["request_id"] and done["status"] == "interrupted", done
    assert (await livesight_metrics(server))["engine"]["running_requests"] == 0
    if engine_running is not None:  # the engine's own count, where it can be read
        deadline = time.monotonic() + 10
        while (running := await engine_running()) != 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert running == 0
    await client.send(type="ping")
    assert (await client.recv())["type"] == "pong"
    await client.ws.close()


async def engine_failure_is_reported(server: RunningServer) -> None:
    client, _ = await connect(server, prefix_warmup=False, sampling={"max_tokens": 4, "temperature": 0})
    await client.frame("g", seed=541)
    events = await client.ask(LONG_QUESTION)
    kinds = _kinds(events)
    assert kinds[0] == "response.start" and "error" in kinds, kinds
    error = next(e for e in events if e["type"] == "error")
    assert error["code"] == "engine_error" and not error.get("closes_session")
    assert "vLLM" not in error["message"] and "Traceback" not in error["message"]  # no internals leak
    done = events[-1]
    assert done["status"] == "failed" and done["request_id"] == events[0]["request_id"]
    again = await client.ask("And now, briefly?")
    assert again[-1]["status"] == "completed"
    await client.ws.close()
