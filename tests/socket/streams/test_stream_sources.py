"""Each kind of source a stream reads, each a real server: RTSP from Debian's GStreamer RTSP
server (over TCP and over UDP), HLS written by FFmpeg and served over HTTP, an HTTP MJPEG
camera; and an RTSP camera that drops mid-stream and comes back on the same address."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import simplejpeg

from server.background import RunningServer
from server.bench.footage import write_colour_clip
from server.bench.camera_servers import RtspCamera, hls_camera, mjpeg_camera

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "camera.mp4"
    write_colour_clip(path, [("grey", 20.0)], fps=25)
    return path


def _status(http: httpx.Client, stream_id: str) -> dict[str, Any]:
    return http.get(f"/v1/streams/{stream_id}").json()


def _until(http: httpx.Client, stream_id: str, check: Any, timeout_s: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = _status(http, stream_id)
        if check(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {status}")


def test_rtsp_over_tcp_and_udp_hls_and_mjpeg_are_sampled_at_the_streams_rate(
        server: RunningServer, clip: Path, tmp_path: Path) -> None:
    """Each source goes live and gives about ``fps`` sampled frames a second of its own
    time, decoding no more frames than it sends (25 fps here, 2 sampled)."""
    jpegs = [simplejpeg.encode_jpeg(__import__("numpy").full((240, 320, 3), v, "uint8")) for v in (90, 110, 130)]
    with RtspCamera({"cam": clip}) as rtsp, hls_camera(clip, tmp_path / "hls") as hls, \
            mjpeg_camera(jpegs, fps=10) as mjpeg, httpx.Client(base_url=server.http_url, timeout=30) as http:
        sources = {"rtsp-tcp": rtsp.url("cam"), "rtsp-udp": rtsp.url("cam") + "?transport=udp",
                   "hls": hls, "mjpeg": mjpeg}
        ids = {}
        try:  # the server is the run's: its streams go whatever happens here
            for name, url in sources.items():
                created = http.post("/v1/streams", json={"source": url, "name": name, "fps": 2})
                assert created.status_code == 201, created.text
                ids[name] = created.json()["stream_id"]
            started = time.monotonic()
            seen = {name: _until(http, sid, lambda s: s["frames_sampled"] >= 6, 60, f"{name}'s frames")
                    for name, sid in ids.items()}
            elapsed = time.monotonic() - started
            for name, status in seen.items():
                assert status["state"] == "live" and status["connects"] == 1 and not status["frames_shed"], status
                assert status["frames_decoded"] <= status["frames_sampled"] * 13 + 30, (name, status)  # 25 fps -> 2
            print("sources:", {n: (s["frames_decoded"], s["frames_sampled"]) for n, s in seen.items()}, f"{elapsed:.1f} s")
        finally:
            for sid in ids.values():
                assert http.delete(f"/v1/streams/{sid}").status_code == 204


def test_an_rtsp_camera_that_drops_mid_stream_is_reconnected_when_it_returns(
        server: RunningServer, clip: Path) -> None:
    """The camera's server goes away while a stream reads it: the stream says reconnecting,
    with the error; the camera comes back on the same port and the stream is live again."""
    camera = RtspCamera({"cam": clip})
    camera.start()
    sid = None
    try:
        with httpx.Client(base_url=server.http_url, timeout=30) as http:
            sid = http.post("/v1/streams", json={"source": camera.url("cam"), "fps": 2}).json()["stream_id"]
            before = _until(http, sid, lambda s: s["frames_sampled"] >= 3, 60, "frames")
            camera.stop()
            dropped = _until(http, sid, lambda s: s["state"] == "reconnecting", 30, "the drop seen")
            assert dropped["errors"], dropped
            camera.start()
            back = _until(http, sid, lambda s: s["state"] == "live" and s["connects"] >= 2
                          and s["frames_sampled"] > before["frames_sampled"] + 2, 60, "the camera back")
            assert back["frames_sampled"] > dropped["frames_sampled"]
            assert http.delete(f"/v1/streams/{sid}").status_code == 204
            sid = None
    finally:
        camera.stop()
        if sid is not None:  # the server is the run's: its streams go whatever happens here
            httpx.delete(f"{server.http_url}/v1/streams/{sid}", timeout=30)
