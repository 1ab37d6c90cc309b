"""engine=openai against a real vLLM OpenAI-compatible server on 127.0.0.1.

The server is vLLM's own on the tiny Idefics3, with an API key: the run's first
``tiny-idefics3`` server (tests/vllm_servers.py), started while the run's first tests run and
shared with the router's tests. livesight is given two replicas, one of them a closed port: sessions whose
rendezvous choice is the dead one must be served by the live one.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import wave
from collections.abc import Iterator

import anyio
import httpx
import numpy as np
import pytest
from anyio.abc import SocketAttribute, SocketStream

from handlers.media.decoder import decode_image
from server.background import RunningServer, free_port, run_server
from server.engines.base import (
    AudioChunk,
    ChatTurn,
    EngineError,
    Finished,
    ImageSegment,
    Prompt,
    Sampling,
    TextDelta,
    TextSegment,
    Usage,
)
from server.engines.openai import OpenAIEngine
from server.engines.openai.replicas import Replica, rendezvous_order
from server.settings import Settings
from tests.heavy.engines import engine_scenarios as scenarios
from tests.protocol_client import connect, jpeg_frame
from tests.vllm_servers import API_KEY, VllmServer, VllmServers

pytestmark = [pytest.mark.anyio, pytest.mark.vllm_servers("tiny-idefics3")]


@pytest.fixture(scope="module")
def vllm_api_server(vllm_servers: VllmServers) -> VllmServer:
    """vLLM's OpenAI-compatible server on the tiny model, with prefix caching and an API key."""
    return vllm_servers.server("tiny-idefics3")


@pytest.fixture(scope="module")
def openai_server(vllm_api_server: VllmServer) -> Iterator[RunningServer]:
    """livesight with engine=openai: a dead replica first, then the real server."""
    dead = f"http://127.0.0.1:{free_port()}"
    settings = Settings(
        engine="openai", openai_urls=f"{dead},{vllm_api_server.url}/v1", openai_api_key=API_KEY,
        openai_health_interval_s=60, max_answer_tokens=3000,
    )
    with run_server(settings) as running:
        yield running


async def vllm_running_requests(server: VllmServer) -> int:
    """The vLLM server's own count of running and waiting requests (its Prometheus metrics)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(server.url + "/metrics")).text
    counts = re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} ([0-9.]+)$", text, re.MULTILINE)
    assert counts, "the vLLM server reports no request gauges"
    return int(sum(float(c) for c in counts))


async def test_session_streams_answer(openai_server: RunningServer) -> None:
    """A WebSocket session on engine=openai streams an answer from the vLLM server."""
    await scenarios.streams_answer(openai_server, "openai")


async def test_repeated_query_reports_cached_tokens(openai_server: RunningServer) -> None:
    """A second query over the same frames reports the server's cached prompt tokens."""
    await scenarios.repeated_query_hits_cache(openai_server)


async def test_warmup_caches_the_frames(openai_server: RunningServer) -> None:
    """The one-token warmup request makes the first query find the frames cached on the server."""
    await scenarios.warmup_caches_prefix(openai_server)


async def test_interrupted_answer_leaves_no_running_request(
    openai_server: RunningServer, vllm_api_server: VllmServer
) -> None:
    """response.cancel closes the stream and the vLLM server aborts the request."""
    await scenarios.interrupt_leaves_no_request(openai_server, lambda: vllm_running_requests(vllm_api_server))


async def test_engine_failure_is_an_error_and_the_session_goes_on(openai_server: RunningServer) -> None:
    """A request the server rejects (prompt over its max_model_len) gives engine_error and a
    failed response.done; the session goes on."""
    await scenarios.engine_failure_is_reported(openai_server)


async def test_sessions_skip_an_unhealthy_replica(openai_server: RunningServer) -> None:
    """Sessions whose preferred replica is down are served by the next one; health is in /metrics."""
    replicas = (await scenarios.livesight_metrics(openai_server))["engine"]["replicas"]
    assert [r["healthy"] for r in replicas] == [False, True]
    served = 0
    for _ in range(6):
        client, _ = await connect(openai_server, prefix_warmup=False, sampling={"max_tokens": 2, "temperature": 0})
        await client.frame("h", seed=551)
        done = (await client.ask("Hi?"))[-1]
        served += done["status"] == "completed"
        await client.ws.close()
    assert served == 6


async def test_wrong_api_key_is_an_engine_error(vllm_api_server: VllmServer) -> None:
    """A server that refuses livesight's key fails each answer with engine_error, not a crash."""
    settings = Settings(engine="openai", openai_urls=vllm_api_server.url, openai_api_key="wrong", model="m")
    with run_server(settings) as running:
        client, _ = await connect(running, prefix_warmup=False, sampling={"max_tokens": 2})
        await client.frame("k", seed=561)
        events = await client.ask("Hi?")
        assert [e["code"] for e in events if e["type"] == "error"] == ["engine_error"]
        assert events[-1]["status"] == "failed"
        await client.ws.close()


def test_rendezvous_choice_is_stable_and_spread() -> None:
    """Each session id always maps to the same replica; removing one moves only its sessions."""
    replicas = [Replica(f"http://r{i}:8000") for i in range(3)]
    first = {sid: rendezvous_order(sid, replicas)[0].base for sid in map(str, range(300))}
    assert first == {sid: rendezvous_order(sid, replicas)[0].base for sid in map(str, range(300))}
    assert all(list(first.values()).count(r.base) > 60 for r in replicas)
    without = [r for r in replicas if r.base != "http://r0:8000"]
    for sid, base in first.items():
        if base != "http://r0:8000":
            assert rendezvous_order(sid, without)[0].base == base


def _sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def test_streamed_audio_becomes_audio_chunks() -> None:
    """vLLM-Omni's audio chunks (base64 WAV) and OpenAI's delta.audio (base64 PCM16) become WAV chunks."""
    wav = io.BytesIO()
    with wave.open(wav, "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(24_000), out.writeframes(b"\x01\x00" * 240)
    pcm = b"\x02\x00" * 480
    omni_wav = base64.b64encode(wav.getvalue()).decode()
    openai_pcm = base64.b64encode(pcm).decode()
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}
    body = _sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo."}}]},
        {"modality": "audio", "choices": [{"index": 0, "delta": {"content": omni_wav}}]},
        {"choices": [{"index": 0, "delta": {"audio": {"data": openai_pcm}}, "finish_reason": "stop"}]},
        {"choices": [], "usage": usage},
    )
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    engine = OpenAIEngine(["http://omni:8091"], model="omni", audio_output=True, transport=httpx.MockTransport(handler))
    await engine.start()
    prompt = Prompt((ChatTurn("user", (TextSegment("hi"),)),))
    events = [e async for e in engine.generate("s", "r", prompt, Sampling(max_tokens=5))]
    await engine.close()
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo."]
    audio = [e.wav for e in events if isinstance(e, AudioChunk)]
    assert len(audio) == 2 and all(a[:4] == b"RIFF" for a in audio)
    with wave.open(io.BytesIO(audio[1])) as got:
        assert got.getframerate() == 24_000 and got.readframes(480) == pcm
    assert events[-1] == Finished("stop", Usage(9, 8, 2))
    assert seen[0]["modalities"] == ["text", "audio"] and seen[0]["stream"] is True


async def test_frames_go_as_data_urls_of_the_clients_bytes() -> None:
    """An image part carries the client's own JPEG bytes as a data URL and the frame key as uuid."""
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"usage": {"prompt_tokens": 300}})

    jpeg = jpeg_frame(3)
    frame = ImageSegment("key-3", decode_image(jpeg, None), jpeg)
    engine = OpenAIEngine(["http://srv:8000/v1"], model="m", transport=httpx.MockTransport(handler))
    await engine.start()
    prompt = Prompt((ChatTurn("system", (TextSegment("sys"),)), ChatTurn("user", (TextSegment("[0.0s]"), frame))), True)
    assert await engine.prefill("s", prompt) == 300
    await engine.close()
    messages = seen[0]["messages"]
    assert messages[0] == {"role": "system", "content": "sys"}
    image = messages[1]["content"][1]
    assert image["uuid"] == "key-3"
    assert image["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    assert seen[0]["max_tokens"] == 1 and seen[0]["stream"] is False


async def test_a_server_failure_before_any_output_is_retried_once() -> None:
    """vLLM fails a request whose cached images drifted and asks for a retry: it is sent again,
    once; a second failure is an EngineError."""
    ok = _sse({"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]})
    failed = _sse({"error": {"message": "Internal server error", "code": 500}})
    replies = [failed, ok, failed, failed]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, content=replies.pop(0), headers={"content-type": "text/event-stream"})

    engine = OpenAIEngine(["http://srv:8000"], model="m", transport=httpx.MockTransport(handler))
    await engine.start()
    prompt = Prompt((ChatTurn("user", (TextSegment("hi"),)),))
    events = [e async for e in engine.generate("s", "r1", prompt, Sampling())]
    assert events[0] == TextDelta("fine") and isinstance(events[-1], Finished)
    with pytest.raises(EngineError, match="Internal server error"):
        [e async for e in engine.generate("s", "r2", prompt, Sampling())]
    assert not replies
    await engine.close()


# ---------------------------------------------------------------------- each frame crosses once


class RecordingTransport(httpx.AsyncBaseTransport):
    """The real HTTP transport, keeping every chat request's destination, body and size."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[tuple[int, dict, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            body = await request.aread()
            self.sent.append((request.url.port, json.loads(body), len(body)))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def image_parts(body: dict) -> list[str]:
    """How each image of a request body travels: "data" (a data URL) or "uuid" (named only)."""
    kinds = []
    for message in body["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else ():
            if part["type"] == "image_url":
                assert part["uuid"]
                kinds.append("uuid" if part["image_url"] is None else "data")
    return kinds


def camera_frame(seed: int) -> ImageSegment:
    jpeg = jpeg_frame(seed)
    return ImageSegment(hashlib.sha256(jpeg).hexdigest(), decode_image(jpeg, None), jpeg)


def watching(frames: list[ImageSegment], question: str | None = None) -> Prompt:
    """The session's prompt over ``frames``: open (a warm prefix) without a question."""
    user: list = []
    for i, frame in enumerate(frames):
        user += [TextSegment(f"[{i * 0.5:.1f}s]"), frame]
    if question is not None:
        user.append(TextSegment(question))
    return Prompt((ChatTurn("system", (TextSegment("You watch a camera."),)), ChatTurn("user", tuple(user))),
                  open_turn=question is None)


async def answer(engine: OpenAIEngine, session_id: str, prompt: Prompt) -> tuple[str, Finished]:
    events = [e async for e in engine.generate(session_id, "q", prompt, Sampling(max_tokens=4))]
    return "".join(e.text for e in events if isinstance(e, TextDelta)), events[-1]


async def test_images_a_replica_holds_go_by_uuid_only(vllm_api_server: VllmServer) -> None:
    """After a warm request sent the frames' data, the question names them by uuid alone (a few
    hundred bytes instead of the images), and vLLM answers it exactly as with the data."""
    recorded, plain = RecordingTransport(), RecordingTransport()
    engine = OpenAIEngine([vllm_api_server.url], api_key=API_KEY, transport=recorded, max_warmups_per_s=100)
    baseline = OpenAIEngine([vllm_api_server.url], api_key=API_KEY, transport=plain, image_references=False)
    await engine.start()
    await baseline.start()
    try:
        frames = [camera_frame(571), camera_frame(572)]
        await engine.prefill("s-uuid", watching(frames))
        text, done = await answer(engine, "s-uuid", watching(frames, "What is there?"))
        await engine.prefill("s-uuid", watching(frames + [camera_frame(573)]))
        plain_text, plain_done = await answer(baseline, "s-plain", watching(frames, "What is there?"))
    finally:
        await engine.close()
        await baseline.close()
    assert [image_parts(body) for _, body, _ in recorded.sent] == [
        ["data", "data"], ["uuid", "uuid"], ["uuid", "uuid", "data"]
    ]
    warm_bytes, question_bytes, third_bytes = (size for _, _, size in recorded.sent)
    frame_b64 = len(base64.b64encode(frames[0].jpeg))
    assert warm_bytes > 2 * frame_b64 and question_bytes < frame_b64 / 5, (warm_bytes, question_bytes, frame_b64)
    assert third_bytes < 1.5 * frame_b64
    assert (text, done.usage.prompt_tokens) == (plain_text, plain_done.usage.prompt_tokens)
    assert done.usage.cached_tokens >= 2 * scenarios.IMAGE_TOKENS
    assert image_parts(plain.sent[0][1]) == ["data", "data"]


async def _proxy(listener: anyio.abc.Listener[SocketStream], upstream_port: int) -> None:
    """Forward every connection to ``upstream_port`` until cancelled."""

    async def pump(source: SocketStream, sink: SocketStream, scope: anyio.CancelScope) -> None:
        try:
            async for data in source:
                await sink.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        scope.cancel()

    async def handle(client: SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", upstream_port) as upstream:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, client, upstream, tg.cancel_scope)
                tg.start_soon(pump, upstream, client, tg.cancel_scope)

    await listener.serve(handle)


async def test_failover_starts_the_new_replicas_set_afresh(vllm_api_server: VllmServer) -> None:
    """A session whose replica goes away is served by the next one, which is sent the frames'
    data (it was never sent them), then named them by uuid; the client sees no failure."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    proxy_port = listener.extra(SocketAttribute.local_port)
    recorded = RecordingTransport()
    engine = OpenAIEngine([f"http://127.0.0.1:{proxy_port}", vllm_api_server.url], api_key=API_KEY,
                          transport=recorded, max_warmups_per_s=100)
    session = next(f"s{i}" for i in range(100) if rendezvous_order(f"s{i}", engine.replicas)[0].base.endswith(
        f":{proxy_port}"))
    frames = [camera_frame(581), camera_frame(582)]
    try:
        async with anyio.create_task_group() as proxy:
            proxy.start_soon(_proxy, listener, vllm_api_server.port)
            await engine.start()
            await engine.prefill(session, watching(frames))
            await answer(engine, session, watching(frames, "What is there?"))
            proxy.cancel_scope.cancel()
        await listener.aclose()
        _, done = await answer(engine, session, watching(frames, "And now?"))
        _, again = await answer(engine, session, watching(frames, "And now?"))
        health = [r["healthy"] for r in engine.stats()["replicas"]]
    finally:
        await engine.close()
    ports = [port for port, _, _ in recorded.sent]
    kinds = [image_parts(body) for _, body, _ in recorded.sent]
    assert ports[:2] == [proxy_port, proxy_port] and kinds[:2] == [["data", "data"], ["uuid", "uuid"]]
    # after the proxy went away: the request that found it gone, then the live replica, afresh
    assert ports[-2:] == [vllm_api_server.port] * 2 and kinds[-2:] == [["data", "data"], ["uuid", "uuid"]], (
        ports, kinds)
    assert done.finish_reason in {"stop", "length"} and again.usage.cached_tokens >= 2 * scenarios.IMAGE_TOKENS
    assert health == [False, True]


async def test_a_server_that_lost_its_caches_is_sent_the_frames_again(
    openai_server: RunningServer, vllm_api_server: VllmServer
) -> None:
    """The vLLM server loses its caches (as a restart does) between two questions of a session:
    the second is answered, with no error event; livesight resent the frames it named by uuid (a
    cache miss). (A server that goes down and comes back: the router's failover test.)"""
    await scenarios.no_sessions(openai_server)
    client, _ = await connect(openai_server, enable_frame_filter=False, sampling={"max_tokens": 4, "temperature": 0})
    for i in range(3):
        await client.frame(f"r{i}", seed=591 + i, pts_ms=i * 500)
    first = await client.ask("What is there?")
    assert first[-1]["status"] == "completed"
    await scenarios.settle(openai_server)
    misses = (await scenarios.livesight_metrics(openai_server))["engine"]["cache_misses"]


    await anyio.to_thread.run_sync(vllm_api_server.forget)
    second = await client.ask("And now?")
    assert [e for e in second if e["type"] == "error"] == []
    assert second[-1]["status"] == "completed", second[-1]
    consumed = next(e for e in second if e["type"] == "video.frames.consumed")
    assert consumed["frame_ids"] == ["r0", "r1", "r2"]
    assert (await scenarios.livesight_metrics(openai_server))["engine"]["cache_misses"] > misses
    await client.ws.close()


async def test_a_server_that_keeps_no_images_gets_their_data() -> None:
    """A server that misses every image named by uuid (its cache off) is sent every image's data
    after a few misses, instead of every request twice; each answer is still served."""
    kinds: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        kinds.append(image_parts(body))
        if "uuid" in kinds[-1]:
            return httpx.Response(400, json={"error": {"message": "Cache miss for image at index 0 but data is not "
                                                                  "provided.", "code": 400}})
        return httpx.Response(200, json={"usage": {"prompt_tokens": 300}})

    engine = OpenAIEngine(["http://srv:8000"], model="m", transport=httpx.MockTransport(handler),
                          max_warmups_per_s=100)
    await engine.start()
    frames = [camera_frame(601)]
    for _ in range(5):
        assert await engine.prefill("s", watching(frames)) == 300
    await engine.close()
    assert kinds == [["data"]] + [["uuid"], ["data"]] * 3 + [["data"]]
    assert engine.stats()["cache_misses"] == 3


async def test_behind_a_router_a_miss_drops_only_that_sessions_images() -> None:
    """One router URL in front of backends that keep images: every request carries its
    session's id in each session header; a session whose requests start missing (it moved to
    another backend) resends its own images and, after three misses in a row, sends data only
    (counted), while another session keeps naming its images by uuid."""
    seen: list[tuple[str, str, list[str]]] = []
    moved = {"a"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        session = request.headers["x-session-id"]
        assert request.headers["x-dynamo-session-id"] == session
        seen.append((session, request.headers.get("x-request-id", ""), image_parts(json.loads(request.content))))
        if session in moved and "uuid" in seen[-1][2]:
            return httpx.Response(400, json={"error": {"message": "Cache miss for image at index 0 but data is not "
                                                                  "provided.", "code": 400}})
        return httpx.Response(200, json={"usage": {"prompt_tokens": 300}})

    engine = OpenAIEngine(["http://router:8000"], model="m", transport=httpx.MockTransport(handler),
                          max_warmups_per_s=100, session_headers=("X-Session-ID", "x-dynamo-session-id"))
    await engine.start()
    frames = [camera_frame(621)]
    for _ in range(5):
        for session in ("a", "b"):
            await engine.prefill(session, watching(frames))
    stats = engine.stats()
    await engine.release("a")
    held_after_release = engine.stats()["replicas"][0]["held_images"]
    await engine.close()
    kinds = {s: [k for who, _, k in seen if who == s] for s in ("a", "b")}
    assert kinds["b"] == [["data"]] + [["uuid"]] * 4
    assert kinds["a"] == [["data"]] + [["uuid"], ["data"]] * 3 + [["data"]]
    assert stats["cache_misses"] == 3 and stats["sessions_data_only"] == 1
    assert held_after_release == 1  # b's image only


async def _warm_requests_while_streaming(max_warmups_per_s: float, frames: int, fps: float) -> list[list[str]]:
    """Stream ``frames`` frames at ``fps`` into a session on engine=openai (an instant mock
    server); returns each warm request's images, in order."""
    sent: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        if body["max_tokens"] == 1:
            sent.append([part["uuid"] for m in body["messages"] if isinstance(m["content"], list)
                         for part in m["content"] if part["type"] == "image_url"])
        return httpx.Response(200, json={"usage": {"prompt_tokens": 300}})

    engine = OpenAIEngine(["http://srv:8000"], model="m", transport=httpx.MockTransport(handler),
                          max_warmups_per_s=max_warmups_per_s)
    with run_server(Settings(engine="openai", openai_urls="http://srv:8000", model="m"), engine) as running:
        # a window with room to spare: no slide's prefill of the next window among the warm requests
        client, _ = await connect(running, enable_frame_filter=False, max_frames=2 * frames)
        for i in range(frames):
            await client.send(type="video.frame", data=base64.b64encode(jpeg_frame(611 + i)).decode(), frame_id=i)
            await anyio.sleep(1 / fps)
        await scenarios.settle(running)
        await client.ws.close()
    return sent


async def test_warm_requests_follow_the_cadence_and_cover_every_frame() -> None:
    """Frames arriving faster than max_warmups_per_s are covered together by the next warm
    request (no queue, no frame left out); a faster cadence warms more often."""
    slow = await _warm_requests_while_streaming(2, frames=16, fps=16)
    fast = await _warm_requests_while_streaming(100, frames=16, fps=16)
    assert len(slow[-1]) == len(fast[-1]) == 16  # the last warm request covers every frame
    assert all(len(a) < len(b) for a, b in zip(slow, slow[1:]))  # each one adds frames
    assert len(slow) <= 5 and len(fast) >= 2 * len(slow), (len(slow), len(fast))


def test_remote_usage_splits_prompt_tokens() -> None:
    """A remote answer's image tokens are the server's own count when it sends one, else the
    prompt tokens less an estimate of its text; spoken words are estimated as audio tokens;
    image + audio never exceed the prompt."""
    from server.engines.base import ChatTurn, ImageSegment, Prompt, TextSegment, Usage
    from server.engines.openai.usage import remote_usage

    image = ImageSegment("k1", np.zeros((8, 8, 3), np.uint8))
    prompt = Prompt((ChatTurn("system", (TextSegment("x" * 40),)), ChatTurn("user", (image, TextSegment("y" * 20)))),
                    spoken="y" * 20)
    reported = {"prompt_tokens": 300, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 250,
                                                                                         "image_tokens": 256}}
    assert remote_usage(reported, prompt) == Usage(300, 250, 5, 256, 5)
    estimated = remote_usage({"prompt_tokens": 300, "completion_tokens": 5}, prompt)
    assert estimated == Usage(300, 0, 5, 300 - (10 + 5 + 2 * 4), 5)
    text_only = Prompt((ChatTurn("user", (TextSegment("hi"),)),), spoken="hello there friend")
    assert remote_usage({"prompt_tokens": 3}, text_only) == Usage(3, 0, 0, 0, 3)
