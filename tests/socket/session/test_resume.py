"""Session resume over a real socket: drop the TCP connection, reconnect with the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import websockets

from handlers.session.resume import ParkedSession, ParkingLot
from server.background import RunningServer, run_server
from server.settings import Settings
from tests.protocol_client import b64, Client, jpeg_frame

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def resuming(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """A server with resume on (30 s grace), two API keys."""
    with run_server(Settings(model=str(tiny_model_dir), resume_grace_s=30, api_keys="key-a,key-b", idle_timeout_s=600)) as running:
        yield running


@pytest.fixture(scope="module")
def short_grace(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """A server whose dropped sessions wait only 0.5 s."""
    with run_server(Settings(model=str(tiny_model_dir), resume_grace_s=0.5)) as running:
        yield running


async def _open(server: RunningServer, key: str | None, **config) -> tuple[Client, dict]:
    headers = {"X-API-Key": key} if key else {}
    ws = await websockets.connect(server.ws_url, max_size=None, additional_headers=headers)
    client = Client(ws)
    await client.send(type="session.config", **config)
    first = await client.recv()
    return client, first


def _drop(client: Client) -> None:
    """Cut the TCP connection without a close frame (a network blip)."""
    client.ws.transport.abort()


async def _until(server: RunningServer, field: str, count: int, key: str | None = None) -> None:
    """Wait until /metrics.json shows ``field == count`` (a busy session parks after its running step)."""
    headers = {"X-API-Key": key} if key else {}
    async with httpx.AsyncClient(base_url=server.http_url, headers=headers) as http:
        with anyio.fail_after(240):
            while (await http.get("/metrics.json")).json()[field] != count:
                await anyio.sleep(0.02)


async def _parked(server: RunningServer, count: int, key: str | None = None) -> None:
    await _until(server, "sessions_parked", count, key)


@pytest.mark.timeout(900)
async def test_dropped_session_resumes_with_frames_history_and_warm_cache(resuming: RunningServer) -> None:
    """32 frames and an answer, TCP dropped, reconnect with the token: resumed, last frame id,
    every acked frame still there, and the next question mostly served from the warm cache."""
    config = {"enable_frame_filter": False, "sampling": {"max_tokens": 3, "temperature": 0}}
    client, ready = await _open(resuming, "key-a", **config)
    assert ready["type"] == "session.ready" and ready["resume_token"] and ready["resumed"] is False
    for i in range(32):  # small frames (~30 tokens each): the warmup stays short on a busy machine
        await client.send(type="video.frame", data=b64(jpeg_frame(300 + i, size=(160, 120))), frame_id=i)
        assert (await client.recv_type("video.frame.ack"))["accepted"]
    await _until(resuming, "sessions_busy", 0, "key-a")  # the frames are warm
    first = (await client.ask("What do you see?"))[-1]
    assert first["status"] == "completed"
    await _until(resuming, "sessions_busy", 0, "key-a")  # the answer joined the warm prefix
    _drop(client)
    await _parked(resuming, 1, "key-a")

    again, back = await _open(resuming, "key-a", resume_token=ready["resume_token"])
    assert back["type"] == "session.ready", back
    assert back["resumed"] is True and back["session_id"] == ready["session_id"]
    assert back["last_frame_id"] == 31
    assert back["resume_token"] and back["resume_token"] != ready["resume_token"]  # single use
    assert back["config"]["sampling"]["max_tokens"] == 3  # the session's own config
    events = await again.ask("And now?")
    consumed = next(e for e in events if e["type"] == "video.frames.consumed")
    assert consumed["frame_ids"] == list(range(32))  # no acked frame lost
    done = events[-1]
    assert done["status"] == "completed"
    assert done["usage"]["cached_tokens"] >= 0.9 * done["usage"]["prompt_tokens"], done["usage"]
    await again.ws.close()
    await _parked(resuming, 0, "key-a")  # a clean close (1000) parks nothing


async def test_wrong_token_or_other_key_gets_resume_failed_and_a_new_session(resuming: RunningServer) -> None:
    """A made-up token, or a real one presented with another API key: error resume_failed, then a fresh session."""
    client, ready = await _open(resuming, "key-a")
    await client.frame("x", seed=77)
    _drop(client)
    await _parked(resuming, 1, "key-a")
    for key, token in (("key-a", "not-a-token"), ("key-b", ready["resume_token"])):
        other, first = await _open(resuming, key, resume_token=token)
        assert first["type"] == "error" and first["code"] == "resume_failed" and not first["closes_session"]
        fresh = await other.recv()
        assert fresh["type"] == "session.ready" and fresh["resumed"] is False
        assert fresh["session_id"] != ready["session_id"]
        await other.ws.close()
    # the real owner still gets it back (a failed attempt does not burn the token)
    owner, back = await _open(resuming, "key-a", resume_token=ready["resume_token"])
    assert back["resumed"] is True and back["last_frame_id"] == "x"
    await owner.ws.close()


async def test_an_expired_token_starts_a_new_session_that_continues_its_memory(short_grace: RunningServer) -> None:
    """After the grace period the parked session is released: its token no longer gives it
    back, but starts a new session (no error) that continues its memory; used again, it gets
    resume_failed."""
    client, ready = await _open(short_grace, None)
    await client.frame(1, seed=5)
    _drop(client)
    await _parked(short_grace, 1)
    await _parked(short_grace, 0)  # the sweeper released it
    again, first = await _open(short_grace, None, resume_token=ready["resume_token"])
    assert first["type"] == "session.ready" and first["resumed"] is False
    assert first["memory_id"] == ready["session_id"] != first["session_id"]
    await again.ws.close()
    used, error = await _open(short_grace, None, resume_token=ready["resume_token"])
    assert error["code"] == "resume_failed"
    assert (await used.recv())["type"] == "session.ready"
    await used.ws.close()


async def test_parking_lot_is_bounded_and_releases_the_oldest() -> None:
    """Beyond its capacity the lot releases the oldest parked session."""
    released: list[str] = []

    async def release(p: ParkedSession) -> None:
        released.append(p.session_id)

    lot = ParkingLot(grace_s=60, capacity=2, release=release)
    tokens = [lot.new_token() for _ in range(3)]
    for i, token in enumerate(tokens):
        await lot.park(token, ParkedSession(f"s{i}", core=None, owner="", ready=None))  # type: ignore[arg-type]
    assert released == ["s0"] and len(lot) == 2
    assert lot.claim(tokens[2], "").session_id == "s2"
    await lot.clear()
    assert released == ["s0", "s1"]


async def test_stream_client_resumes_by_itself(resuming: RunningServer) -> None:
    """StreamClient after a dropped connection: the same session back, a frame sent meanwhile
    delivered after the resume, and the next question answered over all the frames."""
    from server.client.stream import StreamClient

    config = {"enable_frame_filter": False, "sampling": {"max_tokens": 3, "temperature": 0}}
    async with StreamClient.connect(resuming.ws_url, config, api_key="key-a") as client:
        first_id = client.ready.session_id
        for i in range(4):
            await client.send_frame(jpeg_frame(600 + i, size=(160, 120)))
        with anyio.fail_after(120):
            while client.frames.accepted < 4:
                await anyio.sleep(0.02)
        await _until(resuming, "sessions_busy", 0, "key-a")
        _drop(client)  # type: ignore[arg-type]  (a StreamClient has .ws too)
        await anyio.sleep(0.3)  # the client notices the drop
        await client.send_frame(jpeg_frame(610, size=(160, 120)))  # waits for the resumed connection
        answer = await (await client.ask("Still there?")).wait(120)
        assert client.resumes == 1 and client.ready.resumed is True
        assert client.ready.session_id == first_id
        assert answer.status == "completed", answer
        assert answer.frame_ids == [1, 2, 3, 4, 5]
