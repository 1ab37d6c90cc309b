"""A watch on a WebRTC camera track, on the colours demo model through the real server: the
peer's camera (10 fps, VP8) shows a grey screen, then red, then grey; sampled at 2 fps, the
red watch fires once, within two sampled frames of the first red one, as over the WebSocket
(tests/heavy/server/test_watch_colours.py), and never on grey."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from server.background import RunningServer, run_server
from server.client.webrtc_peer import Peer, PictureTrack
from server.models.colour_frames import ColourScene
from server.settings import Settings
from tests.colours_models import ShippedModels

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

FPS = 10
RED = range(30, 60)  # frames 3.0-6.0 s of the track
FIRST_RED = 7  # the sampled frame at 3.0 s (camera_1 is the one at 0 s)
WITHIN = 2
RED_WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 60}


@pytest.fixture(scope="module")
def demo_server(colours_models: ShippedModels) -> Iterator[RunningServer]:
    """The server on the shipped demo model (the colours model of ``livesight serve``)."""
    model = colours_models.get("qwen2_5_vl").path
    with run_server(Settings(model=str(model), resume_grace_s=0)) as running:
        yield running


async def test_a_red_watch_fires_on_the_camera_track_within_two_sampled_frames(demo_server: RunningServer) -> None:
    """Frames are sampled in order (camera_1 at 0 s); one fire, after the first red sampled
    frame and at most two sampled frames later; none on the grey before it. Only the frames
    kept were decoded (a keyframe asked of the peer for each)."""
    scene = ColourScene(np.random.default_rng(3), (320, 240))
    pictures = [scene.frame("red" if n in RED else "grey", n, None).pixels for n in range(12 * FPS)]
    camera = PictureTrack(lambda n: pictures[min(n, len(pictures) - 1)], fps=FPS)
    peer = Peer(camera=camera)
    try:
        assert (await peer.call(f"http://{demo_server.host}:{demo_server.port}", session={
            "type": "realtime", "output_modalities": ["text"], "max_output_tokens": 4,
            "livesight": {"watches": [RED_WATCH], "camera_fps": 2}})).status_code == 201
        added: list[str] = []
        fires: list[int] = []  # how many frames had been added when each fire started
        while len(added) < FIRST_RED + 8:
            event = await peer.next("livesight.camera.frame", "response.created", timeout_s=60)
            assert event["type"] != "error", event
            if event["type"] == "livesight.camera.frame":
                added.append(event["frame_id"])
            elif event["type"] == "response.created":
                assert event["response"]["metadata"] == {"livesight_trigger": "watch", "watch_id": "red"}
                fires.append(len(added))
        assert added[:FIRST_RED] == [f"camera_{k}" for k in range(1, FIRST_RED + 1)], added
        assert len(fires) == 1 and FIRST_RED <= fires[0] <= FIRST_RED + WITHIN, (fires, added)
        # only the kept frames were decoded: a keyframe asked of the sender for each
        import httpx

        frames = httpx.get(f"http://{demo_server.host}:{demo_server.port}/metrics.json").json()["webrtc"]["camera_frames"]
        assert frames["decoded"] >= len(added) and frames["not_decoded"] > 2 * frames["decoded"], frames
        assert frames["keyframe_requests"] >= len(added) // 2, frames  # some kept frames were keyframes unasked
    finally:
        await peer.close()
