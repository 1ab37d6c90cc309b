"""WebRTC calls (``POST /v1/realtime/calls``) with aiortc's own client as the peer: the
data channel speaks the Realtime events, the camera track is sampled into the session, the
answers are spoken on the outgoing track, and bad offers, hangups and keys behave."""

from __future__ import annotations

import numpy as np
import pytest

from server.background import RunningServer
from server.client.webrtc_peer import PictureTrack, Peer

pytestmark = pytest.mark.anyio


def _base(server: RunningServer) -> str:
    return f"http://{server.host}:{server.port}"


async def test_a_call_answers_on_its_data_channel_over_its_sampled_camera(server: RunningServer) -> None:
    """An offer with a 15 fps camera and the oai-events channel is answered (201, Location);
    session.created comes on the channel; the camera is sampled at camera_fps into frames the
    model sees; a question gets a response; hangup ends the call."""
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
        frames = [await peer.next("conversation.item.added") for _ in range(3)]
        assert all(f["item"]["content"][0]["type"] == "input_image" for f in frames)
        peer.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "what do you see?"}]}})
        peer.send({"type": "response.create", "response": {"max_output_tokens": 4}})
        done = await peer.next("response.done")
        assert done["type"] == "response.done" and done["response"]["status"] != "failed", done
        assert camera.count > 3 * 15 / 2 * 0.8  # the peer sent at 15 fps, the server kept 2 a second
        hung = await peer.hang_up(_base(server))
        assert hung.status_code == 200
    finally:
        await peer.close()
