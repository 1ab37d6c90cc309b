"""WebRTC calls (``POST /v1/realtime/calls``) with aiortc's own client as the peer: the
data channel speaks the Realtime events, the camera track is sampled into the session, the
answers are spoken on the outgoing track, and bad offers, hangups and keys behave."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest

from server.background import RunningServer
from server.client.webrtc_peer import Peer, PictureTrack, SpeechTrack

pytestmark = pytest.mark.anyio


def _base(server: RunningServer) -> str:
    return f"http://{server.host}:{server.port}"


async def test_a_call_answers_on_its_data_channel_over_its_sampled_camera(server: RunningServer) -> None:
    """An offer with a 15 fps camera and the oai-events channel is answered (201, Location);
    session.created comes on the channel; the camera is sampled at camera_fps into frames the
    model sees (each said by a livesight.camera.frame event, not a conversation item: media, as
    the microphone is); a question gets a response; hangup ends the call."""
    camera = PictureTrack(lambda n: np.full((240, 320, 3), (n * 7) % 255, np.uint8), fps=15)
    peer = Peer(camera=camera)
    try:
        response = await peer.call(_base(server))
        assert response.status_code == 201, response.text
        assert response.headers["location"].startswith("/v1/realtime/calls/rtc_")
        assert response.headers["content-type"].startswith("application/sdp")
        created = await peer.next("session.created")
        assert created["type"] == "session.created", created
        assert created["session"]["livesight"]["camera_fps"] == 2
        frames = [await peer.next("livesight.camera.frame") for _ in range(3)]
        assert [f["frame_id"] for f in frames] == ["camera_1", "camera_2", "camera_3"]
        assert camera.count >= 3 * len(frames)  # sent at 15 fps, kept at 2 (the first at once)
        peer.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "what do you see?"}]}})
        peer.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        done = await peer.next("response.done")
        assert done["type"] == "response.done" and done["response"]["status"] != "failed", done
        hung = await peer.hang_up(_base(server))
        assert hung.status_code == 200
    finally:
        await peer.close()


async def test_a_spoken_question_on_the_microphone_is_answered_aloud_on_the_call_track(server: RunningServer) -> None:
    """server_vad hears the question on the microphone track (Opus), the answer's words come
    on the data channel and its audio on the outgoing track, never as audio deltas in events."""
    from handlers.wire.audio import Pcm, resample
    from server.bench.spoken import speak_clip

    camera = PictureTrack(lambda n: np.full((240, 320, 3), 90, np.uint8), fps=10)
    microphone = SpeechTrack()
    peer = Peer(camera=camera, microphone=microphone)
    try:
        assert (await peer.call(_base(server))).status_code == 201
        await peer.next("session.created")
        peer.send({"type": "session.update", "session": {
            "output_modalities": ["audio"], "max_output_tokens": 8,
            "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}})
        await peer.next("session.updated")
        await peer.next("livesight.camera.frame")  # a frame: the answer has something to see
        clip = speak_clip("what is on the table", noise=30, seed=1)
        microphone.say(resample(Pcm(clip.pcm16, 16_000), 48_000).samples)
        seen = []
        while True:
            event = await peer.next("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                                    "response.output_audio.delta", "response.done")
            seen.append(event["type"])
            if event["type"] in ("response.done", "error"):
                break
        assert seen[:2] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"], seen
        assert seen[-1] == "response.done" and "response.output_audio.delta" not in seen, seen
        for _ in range(100):  # the audio plays in real time after its words
            if len(peer.heard) >= 48_000 * 2 * 0.3:
                break
            await asyncio.sleep(0.1)
        assert len(peer.heard) >= 48_000 * 2 * 0.3, len(peer.heard)
    finally:
        await peer.close()


async def test_a_v1_call_speaks_protocol_v1_on_its_channel_with_the_camera_and_voice_on_tracks(
        server: RunningServer) -> None:
    """``/v1/video/chat/calls`` with the ``livesight`` channel (the project's page): the first
    message is v1's session.config, whose ``camera_fps`` samples the camera track; its frames
    are acked as v1 frames are; a video.query streams its words on the channel and its voice on
    the call's audio track (no audio deltas on the channel); another channel is closed."""
    camera = PictureTrack(lambda n: np.full((240, 320, 3), (n * 7) % 255, np.uint8), fps=15)
    peer = Peer(camera=camera, path="/v1/video/chat/calls", channel="livesight")
    stray = peer.pc.createDataChannel("oai-events")
    try:
        response = await peer.call(_base(server))
        assert response.status_code == 201, response.text
        assert response.headers["location"].startswith("/v1/video/chat/calls/rtc_")
        peer.send({"type": "session.config", "camera_fps": 4, "enable_frame_filter": False,
                   "modalities": ["text", "audio"], "sampling": {"max_tokens": 6}})
        ready = await peer.next("session.ready")
        assert ready["type"] == "session.ready" and ready["config"]["camera_fps"] == 4, ready
        acks = [await peer.next("video.frame.ack") for _ in range(6)]
        assert [a["frame_id"] for a in acks] == [f"camera_{n}" for n in range(1, 7)]
        span_ms = acks[-1]["server_receive_ts_ms"] - acks[0]["server_receive_ts_ms"]
        assert 5 / 4 * 1000 * 0.6 <= span_ms <= 5 / 4 * 1000 * 1.6, span_ms  # 4 fps of a 15 fps track
        peer.send({"type": "video.query", "text": "what do you see?"})
        seen: list[str] = []
        while not seen or seen[-1] not in ("response.done", "error"):
            seen.append((await peer.next("response.text.delta", "response.output_audio.delta", "response.done"))["type"])
        assert seen[-1] == "response.done" and "response.output_audio.delta" not in seen, seen
        for _ in range(100):  # the voice plays in real time after the words
            if len(peer.heard) >= 48_000 * 2 * 0.2:
                break
            await asyncio.sleep(0.1)
        assert len(peer.heard) >= 48_000 * 2 * 0.2, len(peer.heard)
        assert stray.readyState in ("closing", "closed")
        assert (await peer.hang_up(_base(server))).status_code == 200
    finally:
        await peer.close()


async def test_bad_offers_get_a_clear_400_and_abandoned_offers_are_freed(server: RunningServer) -> None:
    """Not SDP, SDP with no media, a wrong content type: 400 naming the problem. An offer whose
    peer never connects is ended after webrtc_connect_timeout_s (3 s here) and counted."""
    async with httpx.AsyncClient(base_url=_base(server), timeout=30) as http:
        for body, kind, words in [("hello", "application/sdp", "not an SDP offer"),
                                  ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
                                   "application/sdp", "could not be answered"),
                                  ("v=0\r\nm=", "application/json", "application/sdp")]:
            response = await http.post("/v1/realtime/calls", content=body, headers={"Content-Type": kind})
            assert response.status_code == 400 and words in response.json()["error"]["message"], response.text
        assert (await http.post("/v1/realtime/calls/rtc_nope/hangup")).status_code == 404
        before = (await http.get("/metrics.json")).json()["webrtc"]
        abandoned = Peer()  # offers, never takes the answer
        abandoned.pc.addTransceiver("audio", direction="sendrecv")
        await abandoned.pc.setLocalDescription(await abandoned.pc.createOffer())
        response = await http.post("/v1/realtime/calls", content=abandoned.pc.localDescription.sdp,
                                   headers={"Content-Type": "application/sdp"})
        assert response.status_code == 201
        await abandoned.close()
        for _ in range(100):
            now = (await http.get("/metrics.json")).json()["webrtc"]
            if now["abandoned"] > before["abandoned"] and now["calls"] == before["calls"]:
                break
            await asyncio.sleep(0.1)
        assert now["abandoned"] == before["abandoned"] + 1 and now["calls"] == before["calls"], (before, now)


@asynccontextmanager
async def _one_call(server: RunningServer) -> AsyncIterator[tuple[Peer, httpx.AsyncClient, int]]:
    """A call with a small camera, its session created; an HTTP client of the server; the
    server's call count then (``/metrics.json``). The peer is closed after."""
    peer = Peer(camera=PictureTrack(lambda n: np.full((120, 160, 3), 90, np.uint8), fps=5))
    try:
        assert (await peer.call(_base(server))).status_code == 201
        await peer.next("session.created")
        async with httpx.AsyncClient(base_url=_base(server), timeout=30) as http:
            yield peer, http, (await http.get("/metrics.json")).json()["webrtc"]["calls"]
    finally:
        await peer.close()


async def test_a_peer_that_vanishes_is_ended_when_it_misses_its_consent_checks(server: RunningServer) -> None:
    """A peer whose network goes silent (its sockets closed: no hangup, no DTLS close, no
    consent answers) is ended after three consent checks missed in a row, within a few times
    webrtc_peer_timeout_s (6 s here), not aioice's 30 s; its call is freed."""
    timeout_s = server.app.state.calls.settings.webrtc_peer_timeout_s
    async with _one_call(server) as (peer, http, calls):
        ice = peer.pc.sctp.transport.transport
        for protocol in ice._connection._protocols:  # gone without a word
            protocol.transport.close()
        loop = asyncio.get_running_loop()
        vanished_at = loop.time()
        while (await http.get("/metrics.json")).json()["webrtc"]["calls"] != calls - 1:
            assert loop.time() - vanished_at < 3 * timeout_s, "the vanished peer's call is still there"
            await asyncio.sleep(0.2)
        print(f"a vanished peer's call ended {loop.time() - vanished_at:.1f} s after it went silent "
              f"(webrtc_peer_timeout_s {timeout_s})")


async def test_a_peer_that_reads_nothing_is_ended_and_freed(server: RunningServer) -> None:
    """A peer whose channel takes nothing from the server (its SCTP drops every data chunk: no
    acknowledgement, the server's bytes stay buffered) while it keeps asking for more (session
    updates echoed in full) is ended once more than webrtc_max_buffered_bytes wait unsent for
    SEND_WAIT_S; its call and session are freed and the server serves the next call."""
    from server.webrtc.call import SEND_WAIT_S

    limit = server.app.state.calls.settings.webrtc_max_buffered_bytes
    async with _one_call(server) as (peer, http, calls):

        async def deaf(chunk: object) -> None:  # the server's data goes unread and unacknowledged
            return None

        peer.pc.sctp._receive_data_chunk = deaf
        instructions = "x" * 19_000
        loop = asyncio.get_running_loop()
        started = loop.time()
        sent = 0
        while (await http.get("/metrics.json")).json()["webrtc"]["calls"] == calls:
            if sent * len(instructions) < 2 * limit:
                for _ in range(20):
                    peer.send({"type": "session.update", "session": {"type": "realtime",
                                                                     "instructions": instructions + str(sent)}})
                    sent += 1
            assert loop.time() - started < SEND_WAIT_S + 60, "the deaf peer's call is still there"
            await asyncio.sleep(0.5)
        print(f"a deaf peer's call ended {loop.time() - started:.1f} s after it stopped reading "
              f"({sent} session updates of {len(instructions)} characters sent)")
    async with _one_call(server):  # the server serves the next call
        pass


async def test_ephemeral_keys_open_calls_and_sockets_bind_their_session_and_stale_ones_are_refused(
    server: RunningServer,
) -> None:
    """POST /v1/realtime/client_secrets mints an ek_ key as OpenAI does; its session is applied
    when a call or a /v1/realtime socket starts and wins over the client's own; an unknown key
    is refused on calls and sockets; bad requests are 400."""
    import json

    import websockets

    async with httpx.AsyncClient(base_url=_base(server), timeout=30) as http:
        for body in [{"expires_after": {"anchor": "created_at", "seconds": 5}}, {"session": {"max_output_tokens": "x"}},
                     {"expires_after": {"seconds": 7201}}, {"session": []}]:
            assert (await http.post("/v1/realtime/client_secrets", json=body)).status_code == 400, body
        minted = (await http.post("/v1/realtime/client_secrets", json={
            "expires_after": {"anchor": "created_at", "seconds": 600},
            "session": {"type": "realtime", "instructions": "be brief", "livesight": {"camera_fps": 1}}})).json()
        assert minted["value"].startswith("ek_") and minted["session"]["instructions"] == "be brief"
        assert 590 <= minted["expires_at"] - __import__("time").time() <= 601
        stale = await http.post("/v1/realtime/calls", content="v=0", headers={
            "Authorization": "Bearer ek_unknown", "Content-Type": "application/sdp"})
        assert stale.status_code == 401

    peer = Peer(camera=PictureTrack(lambda n: np.zeros((120, 160, 3), np.uint8), fps=5))
    try:
        response = await peer.call(_base(server), minted["value"], session={"type": "realtime", "livesight": {"camera_fps": 5}})
        assert response.status_code == 201, response.text
        for _ in range(2):  # the client's config, then the key's: the key's wins both times
            updated = await peer.next("session.updated")
            assert updated["session"]["livesight"]["camera_fps"] == 1 and updated["session"]["instructions"] == "be brief"
        peer.send({"type": "session.update", "session": {"instructions": "be long", "livesight": {"camera_fps": 10}}})
        updated = await peer.next("session.updated")
        assert updated["session"]["livesight"]["camera_fps"] == 1 and updated["session"]["instructions"] == "be brief"
    finally:
        await peer.close()

    url = f"ws://{server.host}:{server.port}/v1/realtime"
    async with websockets.connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{minted['value']}"]) as ws:
        kinds = [json.loads(await ws.recv()) for _ in range(2)]
        assert [k["type"] for k in kinds] == ["session.created", "session.updated"]
        assert kinds[1]["session"]["instructions"] == "be brief"
    async with websockets.connect(url, subprotocols=["realtime", "openai-insecure-api-key.ek_stale"]) as ws:
        refused = json.loads(await ws.recv())
        assert refused["type"] == "error" and "ephemeral" in refused["error"]["message"]


async def test_cors_preflight_is_answered_for_the_sdks_headers_only(server: RunningServer) -> None:
    """The shared server lists no allowed origins: a page of another origin is refused its
    preflight and its offer (403); the same origin needs none. The policy that admits an
    origin answers the headers OpenAI's SDK sends and exposes Location (unit-tested with
    AccessPolicy: tests/core/server/test_client_secrets.py covers keys)."""

    from server.auth import AccessPolicy
    from server.webrtc.calls import ALLOWED_HEADERS, _cors

    asks = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-openai-agents-sdk"}
    async with httpx.AsyncClient(base_url=_base(server), timeout=30) as http:
        assert (await http.options("/v1/realtime/calls", headers=asks)).status_code == 403
        refused = await http.post("/v1/realtime/calls", content="v=0", headers={"Origin": "https://app.example"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_origin"
        same = await http.post("/v1/realtime/calls", content="v=0", headers={"Origin": _base(server)})
        assert same.status_code == 400  # judged as an offer (not SDP), no CORS needed

    class Asked:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = {k.lower(): v for k, v in headers.items()} | {"host": "livesight.local"}

    policy = AccessPolicy([], ["https://app.example"])
    cors, allowed = _cors(Asked(asks), policy)  # type: ignore[arg-type]
    assert allowed and cors["Access-Control-Allow-Origin"] == "https://app.example"
    assert cors["Access-Control-Expose-Headers"] == "Location"
    assert {"authorization", "content-type", "x-openai-agents-sdk"} <= set(ALLOWED_HEADERS)
    assert _cors(Asked({"Origin": "https://evil.example"}), policy) == ({"Vary": "Origin"}, False)  # type: ignore[arg-type]
