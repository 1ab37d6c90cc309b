"""A session's memory through the real server, the real embedded engine on the shipped
colours model and the real SQLite store: scenes that left the window are answered about by
range, found by a condition and by text, served as keyframes, and forgotten on request."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
import simplejpeg

from server.background import RunningServer, run_server
from server.models.colour_frames import colour_clip
from server.models.demo import DEMO_FAMILY, shipped_model_dir
from server.settings import Settings
from tests.protocol_client import Client, b64, connect
from tests.sqlite_bytes import bytes_on_disk

pytestmark = pytest.mark.anyio

SCENES = ["red", "blue", "green", "blue", "yellow", "red", "blue", "white"]
FRAMES_PER_SCENE = 3
WINDOW = 6  # frames: every scene but the last two has left it by the end


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def colours_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The colours model, keyframes only at scene changes (the stream is fast), its memory in
    SQLite (the default) or in a real PostgreSQL server."""
    data = tmp_path_factory.mktemp("memory-data")
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    settings = Settings(model=str(shipped_model_dir(DEMO_FAMILY)), resume_grace_s=0, data_dir=data,
                        memory_url=url, memory_keyframe_s=3600, memory_min_keyframe_s=0,
                        memory_caption_prompt="What colour is the screen?", memory_caption_tokens=3)
    with run_server(settings) as running:
        yield running


async def _stream_scenes(client: Client, http: httpx.AsyncClient, session_id: str) -> list[tuple[float, float]]:
    """Each scene's frames sent, then its moment's caption waited for; each scene's span (its
    first and last frame's receipt, ms)."""
    rng = np.random.default_rng(5)
    spans = []
    frame_id = 0
    for colour in SCENES:
        times = []
        for frame in colour_clip(rng, [colour] * FRAMES_PER_SCENE, None, size=(320, 240)):
            frame_id += 1
            await client.send(type="video.frame", data=b64(frame.jpeg), frame_id=frame_id)
            ack = await client.recv_type("video.frame.ack")
            assert ack["accepted"], ack
            times.append(ack["server_receive_ts_ms"])
        spans.append((times[0], times[-1]))
        with anyio.fail_after(30):  # written when the engine is idle, after the scene's prefills
            while not (await _moments(http, session_id, len(spans)))[-1]["caption"]:
                await anyio.sleep(0.05)
    return spans


async def _moments(http: httpx.AsyncClient, session_id: str, count: int) -> list[dict]:
    """The session's moments once ``count`` are stored (writes are queued off the loop)."""
    with anyio.fail_after(30):
        while True:
            moments = (await http.get(f"/v1/sessions/{session_id}/moments")).json()["moments"]
            if len(moments) >= count:
                return moments
            await anyio.sleep(0.05)


async def test_past_scenes_are_answered_by_range_found_by_condition_and_text_then_forgotten(
    colours_server: RunningServer,
) -> None:
    """Eight scenes, three frames each, through a six-frame window: one moment a scene, each
    captioned with its colour; a question about each scene's range is shown its keyframe and
    names its colour; the live window is untouched; "Is the screen blue?" finds exactly the
    blue scenes; "blue" finds their captions and the answers that said it; keyframes are
    served; memory.clear removes it all from the database file and the session goes on."""
    client, ready = await connect(colours_server, max_frames=WINDOW, sampling={"max_tokens": 3, "temperature": 0})
    session_id = ready["session_id"]
    try:
        async with httpx.AsyncClient(base_url=colours_server.http_url) as http:
            spans = await _stream_scenes(client, http, session_id)
            moments = await _moments(http, session_id, len(SCENES))
            # each moment's caption, written on the warm prefix, names its scene's colour
            assert sum(c in m["caption"].lower() for m, c in zip(moments, SCENES)) >= 0.95 * len(SCENES), moments
            # one moment a scene (each colour change is a scene change), starting at its first frame
            assert [m["start_ms"] for m in moments] == [first for first, _ in spans]
            assert all(m["end_ms"] == n["start_ms"] for m, n in zip(moments, moments[1:]))

            # a question about each scene's range is shown that scene's keyframe and names its colour
            right = 0
            for (first, last), colour, moment in zip(spans, SCENES, moments, strict=True):
                events = await client.ask("What colour is the screen?", range={"from_ms": first, "to_ms": last})
                consumed = next(e for e in events if e["type"] == "video.frames.consumed")
                assert consumed["frame_ids"] == [f"moment_{moment['moment_id']}"]
                assert consumed["frames"][0]["server_receive_ts_ms"] == first
                text = "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
                right += colour in text.lower()
                assert events[-1]["status"] == "completed"
            assert right >= 0.95 * len(SCENES), right

            # the live window is untouched: a question about now is still about the newest scene, warm
            now = await client.ask("What colour is the screen?")
            assert SCENES[-1] in "".join(e["delta"] for e in now if e["type"] == "response.text.delta").lower()

            # a condition over the whole session finds the blue scenes, with progress on the way
            await client.send(type="memory.search", search_id="blue", condition="Is the screen blue?")
            found = await client.collect_until("memory.results", timeout=120)
            progress = [e for e in found if e["type"] == "memory.progress"]
            assert progress and progress[-1]["checked"] == progress[-1]["total"] == len(SCENES)
            results = found[-1]
            assert results["search_id"] == "blue" and results["checked"] == len(SCENES)
            blue = {m["moment_id"] for m, c in zip(moments, SCENES) if c == "blue"}
            assert {r["moment_id"] for r in results["results"]} == blue, results
            assert all(r["probability"] >= 0.5 for r in results["results"])

            # text finds the captions of the blue scenes, and the answers that named blue
            await client.send(type="memory.search", text="blue", limit=50)
            by_text = (await client.recv_type("memory.results"))["results"]
            assert {r["moment_id"] for r in by_text if r["kind"] == "caption"} == blue, by_text
            assert {r["kind"] for r in by_text} == {"caption", "answer"}
            assert all("blue" in r["match"].lower() for r in by_text)

            # each keyframe is served as a JPEG at the model's size
            jpeg = await http.get(results["results"][0]["url"])
            assert jpeg.status_code == 200 and jpeg.headers["content-type"] == "image/jpeg"
            height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg.content)
            assert max(width, height) <= 320
            assert (await http.get(f"/v1/sessions/{session_id}/moments/999999.jpg")).status_code == 404
            assert (await http.get(f"/v1/sessions/{'x' * 300}/moments/1.jpg")).status_code == 404
            assert (await http.get(f"/v1/sessions/{'x' * 300}/moments")).status_code == 404  # no session could have it
            assert (await http.get(f"/v1/sessions/{session_id}/moments?from_ms=abc")).status_code == 400

            # forgetting: gone from the store and from the database file
            await client.send(type="memory.clear")
            cleared = await client.recv_type("memory.cleared")
            assert cleared["deleted"] >= len(SCENES)
            assert (await http.get(f"/v1/sessions/{session_id}/moments")).json()["moments"] == []
            await client.send(type="video.query", text="What colour was it?", range={"from_ms": spans[0][0]})
            error = await client.recv_type("error")
            assert error["code"] == "no_frames"
        store = colours_server.app.state.memory.store
        await client.send(type="ping")
        assert (await client.recv_type("pong"))["type"] == "pong"
        if store.backend != "sqlite":
            return
        database = Path(store.path)
        with contextlib.closing(sqlite3.connect(database)) as db:
            assert db.execute("SELECT count(*) FROM moments WHERE session_id = ?", (session_id,)).fetchone() == (0,)
        assert jpeg.content[200:264] not in bytes_on_disk(database)
    finally:
        await client.ws.close()


async def test_bad_memory_requests_get_clear_errors_and_the_session_goes_on(
    colours_server: RunningServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A search that asks nothing, a range that ends before it starts, a store that fails, and
    memory asked of a session that keeps none: each an error with its code; the session
    answers a ping after."""
    client, _ = await connect(colours_server)
    try:
        async def broken(*args: object, **kwargs: object) -> None:
            raise OSError("the disk went away")

        with monkeypatch.context() as patch:
            patch.setattr(colours_server.app.state.memory.store, "search_text", broken)
            await client.send(type="memory.search", text="blue")
            assert (await client.recv_type("memory.results"))["results"] == []
            assert (await client.recv_type("error"))["code"] == "internal_error"
        await client.send(type="ping")
        await client.recv_type("pong")
        await client.send(type="memory.search", search_id="x")
        assert (await client.recv_type("error"))["code"] == "invalid_message"
        await client.send(type="video.query", text="?", range={"from_ms": 2_000, "to_ms": 1_000})
        assert (await client.recv_type("error"))["code"] == "invalid_message"
        await client.send(type="memory.search", text='"AND (NEAR(*', from_ms=-60_000)
        assert (await client.recv_type("memory.results"))["results"] == []
    finally:
        await client.ws.close()
    client, ready = await connect(colours_server, memory={"enabled": False})
    try:
        assert ready["config"]["memory"] == {"enabled": False}
        await client.send(type="memory.search", text="blue")
        assert (await client.recv_type("error"))["code"] == "memory_off"
        await client.send(type="ping")
        await client.recv_type("pong")
    finally:
        await client.ws.close()


async def test_the_realtime_endpoint_searches_and_clears_memory_as_livesight_events(server: RunningServer) -> None:
    """On /v1/realtime: images become moments; ``session.livesight.memory`` is echoed;
    ``livesight.memory.search`` (a text search: the question asked is noted) is answered by
    ``livesight.memory.results`` and ``livesight.memory.clear`` by ``livesight.memory.cleared``;
    a bad search is an OpenAI-shaped error and the session goes on."""
    import json

    import websockets

    async with websockets.connect(f"ws://{server.host}:{server.port}/v1/realtime") as ws:

        async def until(kind: str) -> dict:
            with anyio.fail_after(60):
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] in (kind, "error"):
                        return event

        assert (await until("session.created"))["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 2, "livesight": {"memory": {"enabled": True}}}}))
        assert (await until("session.updated"))["session"]["livesight"]["memory"] == {"enabled": True}
        image = "data:image/jpeg;base64," + b64(colour_clip(np.random.default_rng(1), ["red"], None)[0].jpeg)
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": image}, {"type": "input_text", "text": "zebra crossing?"}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        assert (await until("response.done"))["type"] == "response.done"
        with anyio.fail_after(30):
            while True:
                await ws.send(json.dumps({"type": "livesight.memory.search", "search_id": "z", "text": "zebra"}))
                found = await until("livesight.memory.results")
                assert found["type"] == "livesight.memory.results", found
                if found["results"]:
                    break
                await anyio.sleep(0.25)  # the note is written off the loop (and searches are control messages)
        assert found["search_id"] == "z" and found["results"][0]["kind"] == "question"
        await ws.send(json.dumps({"type": "livesight.memory.search", "limit": 0, "text": "x"}))
        error = await until("error")
        assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
        # a response about the past: response.livesight.range, its question in response.input or pending
        question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what colour?"}]}
        await ws.send(json.dumps({"type": "response.create", "response": {
            "livesight": {"range": {"from_ms": -600_000}}, "input": [question], "metadata": {"about": "past"}}}))
        done = await until("response.done")
        assert done["type"] == "response.done" and done["response"]["status"] != "failed", done  # 2 tokens: incomplete
        assert done["response"]["metadata"] == {"about": "past"} and done["response"]["output"]
        await ws.send(json.dumps({"type": "response.create", "response": {"livesight": {"range": {"from_ms": -600_000}}}}))
        assert "question" in (await until("error"))["error"]["message"]  # none pending, none given
        await ws.send(json.dumps({"type": "response.create", "response": {
            "livesight": {"range": {"from_ms": 1000, "to_ms": 2000}}, "input": [question]}}))
        assert (await until("error"))["error"]["code"] == "no_frames"  # nothing remembered in 1970
        await ws.send(json.dumps({"type": "livesight.memory.clear"}))
        assert (await until("livesight.memory.cleared"))["deleted"] >= 2


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_memory_is_found_again_with_the_handle_after_a_clean_close_and_after_a_restart(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """A session that closed cleanly (not parked) is continued by a connection that brings its
    resume token: same memory_id, past scenes answered by range; a restarted server (a new
    process's store over the same SQLite file, or another server on the same PostgreSQL) finds
    it the same way; a token works once, and another key's is refused; another key cannot see
    the session's moments over HTTP."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else None
    settings = Settings(model=str(shipped_model_dir(DEMO_FAMILY)), data_dir=tmp_path, memory_url=url,
                        resume_grace_s=30, memory_keyframe_s=3600, memory_min_keyframe_s=0, memory_caption_tokens=0,
                        api_keys=["key-a", "key-b"])
    rng = np.random.default_rng(9)

    async def open_session(server: RunningServer, key: str = "key-a", **config: object) -> tuple[Client, dict]:
        client, ready = await Client.open(server.ws_url + f"?api_key={key}", {"max_frames": 4, "sampling": {
            "max_tokens": 3, "temperature": 0}, **config}, open_timeout=60)
        return client, ready.data

    async def answer(client: Client, span: tuple[float, float]) -> str:
        events = await client.ask("What colour is the screen?", range={"from_ms": span[0], "to_ms": span[1]})
        return "".join(e["delta"] for e in events if e["type"] == "response.text.delta").lower()

    with run_server(settings) as server:
        client, ready = await open_session(server)
        spans = []
        for n, colour in enumerate(["red", "blue"]):
            frame = colour_clip(rng, [colour], None, size=(320, 240))[0]
            await client.send(type="video.frame", data=b64(frame.jpeg), frame_id=n)
            ack = await client.recv_type("video.frame.ack")
            spans.append((ack["server_receive_ts_ms"], ack["server_receive_ts_ms"]))
        first_id = ready["memory_id"]
        assert first_id == ready["session_id"]
        await client.send(type="video.done")
        await client.recv_type("session.done")
        await client.ws.close()
        async with httpx.AsyncClient(base_url=server.http_url, headers={"x-api-key": "key-a"}) as http:
            listed = await _moments(http, first_id, 2)
        async with httpx.AsyncClient(base_url=server.http_url, headers={"x-api-key": "key-b"}) as http:
            # another key's session: its moments are not listed nor served (as if it did not exist)
            assert (await http.get(f"/v1/sessions/{first_id}/moments")).status_code == 404
            assert (await http.get(f"/v1/sessions/{first_id}/moments/{listed[0]['moment_id']}.jpg")).status_code == 404

        client, again = await open_session(server, resume_token=ready["resume_token"])
        assert again["memory_id"] == first_id and again["session_id"] != first_id and not again["resumed"]
        assert "blue" in await answer(client, spans[1])
        token = again["resume_token"]
        await client.ws.close()

    with run_server(settings) as server:  # a new server: a restart, or another replica of the store
        other, refused = await open_session(server, key="key-b", resume_token=token)
        assert refused["memory_id"] == refused["session_id"]  # another key's token finds nothing
        assert other.events[0]["code"] == "resume_failed"  # sent before its session.ready
        await other.ws.close()
        client, later = await open_session(server, resume_token=token)
        assert later["memory_id"] == first_id
        assert "red" in await answer(client, spans[0])
        await client.ws.close()
        client, used = await open_session(server, resume_token=token)  # a token works once
        assert used["memory_id"] == used["session_id"] != first_id
        await client.ws.close()
