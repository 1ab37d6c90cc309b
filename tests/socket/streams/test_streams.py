"""Cameras the server pulls itself (``/v1/streams``), on the colours demo model through the
real server: a clip of a red, then grey, then red screen, read from a file as a camera;
the red watch fires twice; each fire and narration goes to a real webhook receiver (which
fails three times first) signed and once per idempotency key, to a real MQTT broker (Debian's
Mosquitto, with Home Assistant discovery) and to Server-Sent Events resumable with
``Last-Event-ID``; the evidence frames are the red screen. A delivery pending when the server
stops is made by the next one. Bad sources are refused or fail in the stream's state; a source
that never answers is retried, not waited on."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import simplejpeg

from server.background import RunningServer, run_server
from server.bench.footage import write_colour_clip
from server.bench.camera_servers import WebhookReceiver, free_port, mosquitto
from server.settings import Settings
from tests.colours_models import ShippedModels

pytestmark = pytest.mark.timeout(300)

SECRET = "whsec-test-secret"
RED_WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 0}
SCENES = [("red", 3.0), ("grey", 4.0), ("red", 3.0)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "screen.mp4"
    write_colour_clip(path, SCENES, fps=10)
    return path


class Subscriber:
    """An MQTT client of the broker holding every message it hears (topic, payload, retained)."""

    def __init__(self, url: str) -> None:
        import paho.mqtt.client as mqtt

        host, port = url.removeprefix("mqtt://").split(":")
        self.messages: list[tuple[str, bytes, bool]] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.client.on_message = lambda client, data, m: self.messages.append((m.topic, m.payload, bool(m.retain)))
        self.client.connect(host, int(port))
        self.client.subscribe("#", qos=1)
        self.client.loop_start()

    def on(self, topic: str) -> list[bytes]:
        return [payload for t, payload, _ in list(self.messages) if t == topic]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with mosquitto() as url:
        yield url


@pytest.fixture(scope="module")
def demo_server(colours_models: ShippedModels, tmp_path_factory: pytest.TempPathFactory,
                broker: str) -> Iterator[RunningServer]:
    model = colours_models.get("qwen2_5_vl").path
    settings = Settings(model=str(model), resume_grace_s=0, data_dir=tmp_path_factory.mktemp("data"),
                        api_keys=["key-a", "key-b"], max_streams=4, stream_open_timeout_s=1.0,
                        stream_read_timeout_s=1.0, stream_retry_max_s=2.0, mqtt_url=broker)
    with run_server(settings) as running:
        yield running


def _http(server: RunningServer, key: str = "key-a") -> httpx.Client:
    return httpx.Client(base_url=server.http_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _sse(server: RunningServer, stream_id: str, last_event_id: int, count: int) -> list[dict[str, Any]]:
    """``count`` events of a stream's event stream read after ``last_event_id``."""
    out: list[dict[str, Any]] = []
    with _http(server) as http, http.stream("GET", f"/v1/streams/{stream_id}/events",
                                            headers={"Last-Event-ID": str(last_event_id)}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        event: dict[str, Any] = {}
        for line in response.iter_lines():
            if line.startswith("id: "):
                event["id"] = int(line[4:])
            elif line.startswith("event: "):
                event["event"] = line[7:]
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
            elif not line and "data" in event:
                out.append(event)
                event = {}
                if len(out) == count:
                    return out
    return out


def test_a_file_camera_fires_twice_delivered_signed_once_per_key_with_evidence_and_sse(
        demo_server: RunningServer, clip: Path, broker: str) -> None:
    """The clip (red, grey, red) fires the red watch twice; the receiver fails three times,
    then takes each fire and narration once per event id, every try signed; the same events
    reach MQTT with the watch's state and its Home Assistant sensor; the evidence is the red
    frame (and the grey ones before it); SSE gives them all, and resumes after an id."""
    receiver = WebhookReceiver(SECRET, failures=3)
    subscriber = Subscriber(broker)
    try:
        with _http(demo_server) as http:
            created = http.post("/v1/streams", json={
                "source": f"file://{clip}", "name": "door", "fps": 2, "lookback_s": 1.5,
                "config": {"sampling": {"max_tokens": 4}}, "watches": [RED_WATCH],
                "deliver": {"webhook": {"url": receiver.url, "secret": SECRET}, "mqtt": {"topic": "livesight/door"}}})
            assert created.status_code == 201, created.text
            stream_id = created.json()["stream_id"]
            assert created.headers["location"] == f"/v1/streams/{stream_id}"
            assert http.get(f"/v1/streams/{stream_id}", headers={"Authorization": "Bearer key-b"}).status_code == 404
            status = _wait(lambda: (s := http.get(f"/v1/streams/{stream_id}").json())["state"] == "ended" and s, 60,
                           "the clip to play to its end")
            assert status["frames_decoded"] + status["frames_skipped"] == 100, status  # those no sample needed: skipped
            assert 19 <= status["frames_sampled"] <= 21 and status["frames_skipped"] > 20, status
            assert status["deliver"]["webhook"]["secret"] == "***"

            def fires() -> list[dict[str, Any]]:
                return [r["body"] for r in receiver.accepted().values() if r["body"]["type"] == "watch.fired"]

            _wait(lambda: len(fires()) == 2, 60, "two fires at the webhook, after its three failures")
            _wait(lambda: sum(r["body"]["type"] == "watch.narration" for r in receiver.accepted().values()) == 2, 30,
                  "two narrations")
            taken = receiver.accepted()
            assert all(r["signed"] for r in receiver.requests), receiver.requests
            assert sum(r["status"] == 500 for r in receiver.requests) == 3
            kinds = sorted(r["body"]["type"] for r in taken.values())
            assert kinds == ["watch.cleared", "watch.fired", "watch.fired", "watch.narration", "watch.narration"], kinds
            assert len({r["event_id"] for r in receiver.requests}) == 5  # retried under one key each
            first, second = sorted(fires(), key=lambda b: b["seq"])
            assert first["watch_id"] == "red" and first["condition"] == "Is the screen red?"
            assert first["stream_id"] == stream_id and first["stream_name"] == "door"
            assert first["frame_pts_ms"] < 1000 and 7000 <= second["frame_pts_ms"] < 8500, (first, second)
            for fire in (first, second):
                jpeg = http.get(fire["evidence"]["frame"])
                assert jpeg.status_code == 200 and jpeg.headers["content-type"] == "image/jpeg"
                r, g, b = simplejpeg.decode_jpeg(jpeg.content).reshape(-1, 3).mean(axis=0)
                assert r > 150 and g < 90 and b < 90, (r, g, b)
            assert len(second["evidence"]["lookback"]) >= 2  # the grey frames before the red came back
            assert http.get(second["evidence"]["lookback"][-1],
                            headers={"Authorization": "Bearer key-b"}).status_code == 404
            assert http.get(f"/v1/streams/{stream_id}").json()["deliveries"] == {"delivered": 10}  # webhook + MQTT

            fired = _wait(lambda: len(subscriber.on("livesight/door/red/fired")) == 2 and
                          subscriber.on("livesight/door/red/fired"), 30, "two fires over MQTT")
            assert sorted(json.loads(m)["id"] for m in fired) == sorted(f["id"] for f in (first, second))
            assert subscriber.on("livesight/door/red/state") == [b"ON", b"OFF", b"ON"]
            assert len(subscriber.on("livesight/door/red/narration")) == 2
            config = json.loads(subscriber.on(f"homeassistant/binary_sensor/livesight_{stream_id}_red/config")[0])
            assert config["name"] == "Is the screen red?" and config["state_topic"] == "livesight/door/red/state"
            assert config["device"]["name"] == "door"

            everything = _sse(demo_server, stream_id, 0, 5)
            assert [e["event"] for e in everything].count("watch.fired") == 2
            assert [e["data"]["id"] for e in everything] == [e["data"]["id"] for e in
                                                             sorted(everything, key=lambda e: e["id"])]
            rest = _sse(demo_server, stream_id, everything[0]["id"], 4)
            assert [e["id"] for e in rest] == [e["id"] for e in everything[1:]]  # resumed after the one seen

            assert http.delete(f"/v1/streams/{stream_id}").status_code == 204
            assert http.get(f"/v1/streams/{stream_id}").status_code == 404
            assert http.get(first["evidence"]["frame"]).status_code == 404
    finally:
        subscriber.close()
        receiver.close()


def test_bad_sources_are_refused_or_fail_and_a_silent_one_is_retried_not_waited_on(
        demo_server: RunningServer, tmp_path: Path) -> None:
    """Bad bodies get 400 saying what; a missing file, a file that is no video and a page that
    is no camera fail; a source that accepts and never answers is retried within its timeouts;
    max_streams holds; another key sees none of them; deleting frees them all."""
    not_video = tmp_path / "notes.mp4"
    not_video.write_bytes(b"this is not a video at all " * 100)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    port = silent.getsockname()[1]
    try:
        with _http(demo_server) as http:
            for body, words in [({"source": "ftp://camera/x"}, "rtsp://"), ({"source": "rtsp://"}, "no host"),
                                ({"source": "file:///x", "fps": 0}, "fps"), ({"source": "file:///x", "x": 1}, "x"),
                                ({"source": "file:///x", "watches": [{"condition": ""}]}, "condition"),
                                ({"source": "file:///x", "deliver": {"webhook": {"url": "gopher://x"}}}, "url")]:
                refused = http.post("/v1/streams", json=body)
                assert refused.status_code == 400 and words in refused.json()["error"]["message"], (body, refused.text)
            assert httpx.post(f"{demo_server.http_url}/v1/streams", json={"source": "file:///x"}).status_code == 401

            missing = http.post("/v1/streams", json={"source": f"file://{tmp_path}/none.mp4"}).json()["stream_id"]
            garbage = http.post("/v1/streams", json={"source": f"file://{not_video}"}).json()["stream_id"]
            hung = http.post("/v1/streams", json={"source": f"rtsp://127.0.0.1:{port}/cam"}).json()["stream_id"]
            html = http.post("/v1/streams", json={"source": f"{demo_server.http_url}/"}).json()["stream_id"]
            assert http.post("/v1/streams", json={"source": "file:///x"}).status_code == 429  # max_streams 4

            def state(stream_id: str) -> dict[str, Any]:
                return http.get(f"/v1/streams/{stream_id}").json()

            for stream_id in (missing, garbage, html):
                failed = _wait(lambda s=stream_id: state(s)["state"] == "failed" and state(s), 30, "a failed state")
                assert failed["errors"] and failed["frames_decoded"] == 0, failed
            started = time.monotonic()
            retried = _wait(lambda: len(state(hung)["errors"]) >= 2 and state(hung), 30, "two tries at the silent source")
            assert retried["state"] in ("connecting", "reconnecting") and time.monotonic() - started < 15, retried
            listed = http.get("/v1/streams").json()["streams"]
            assert {s["stream_id"] for s in listed} == {missing, garbage, hung, html}
            assert http.get("/v1/streams", headers={"Authorization": "Bearer key-b"}).json()["streams"] == []
            for stream_id in (missing, garbage, hung, html):
                assert http.delete(f"/v1/streams/{stream_id}").status_code == 204
            metrics = http.get("/metrics.json").json()["streams"]
            assert metrics["streams"] == 0, metrics
    finally:
        silent.close()


def test_deliveries_pending_when_the_server_stops_are_made_by_the_next_one(
        tiny_model_dir: Path, clip: Path, tmp_path: Path) -> None:
    """The webhook's receiver is down while a stream fires (a watch the random model always
    fires at threshold 0): the events wait in the outbox; the server stops; the next server on
    the same data directory delivers each of them once the receiver is up, signed, once per
    idempotency key, and pulls the stream again under its id (with its PATCHed watches)."""
    port = free_port()
    settings = Settings(model=str(tiny_model_dir), resume_grace_s=0, data_dir=tmp_path / "data",
                        webhook_max_retry_s=1.0)
    with run_server(settings) as first, httpx.Client(base_url=first.http_url, timeout=30) as http:
        stream_id = http.post("/v1/streams", json={
            "source": f"file://{clip}", "fps": 2, "config": {"sampling": {"max_tokens": 2}},
            "watches": [{"watch_id": "any", "condition": "Is there a screen?", "threshold": 0, "clear_threshold": 0}],
            "deliver": {"webhook": {"url": f"http://127.0.0.1:{port}/hook", "secret": SECRET}}}).json()["stream_id"]
        pending = _wait(lambda: (d := http.get(f"/v1/streams/{stream_id}").json()["deliveries"]).get("pending", 0) >= 2
                        and d, 60, "deliveries waiting for the receiver")
        assert "delivered" not in pending
        patched = http.patch(f"/v1/streams/{stream_id}", json={"watches": [
            {"watch_id": "still", "condition": "Is there still a screen?", "threshold": 0, "clear_threshold": 0}]})
        assert patched.status_code == 200, patched.text
    receiver = WebhookReceiver(SECRET, port=port)
    try:
        with run_server(settings) as second, httpx.Client(base_url=second.http_url, timeout=30) as http:
            taken = _wait(lambda: len(receiver.accepted()) >= pending["pending"] and receiver.accepted(), 60,
                          "the pending deliveries made by the next server")
            again = _wait(lambda: (s := http.get(f"/v1/streams/{stream_id}").json()).get("frames_sampled", 0) > 0 and s,
                          60, "the stream pulled again")
            assert [w["watch_id"] for w in again["watches"]] == ["still"], again
            assert http.delete(f"/v1/streams/{stream_id}").status_code == 204
        assert all(r["signed"] for r in receiver.requests)
        # each under its own key: a try the receiver took but whose answer came too late (a busy
        # host) is tried again under the same key, which is what the key is for
        assert {r["event_id"] for r in receiver.requests} == set(taken)
        assert {r["body"]["stream_id"] for r in taken.values()} == {stream_id}
    finally:
        receiver.close()


def test_a_client_attached_to_a_stream_hears_it_asks_about_it_and_adds_a_watch(
        demo_server: RunningServer, clip: Path) -> None:
    """A v1 WebSocket with ?stream_id= hears the stream's session.ready, then its camera's frames
    as they are acked; its own frame is refused and the connection goes on; its question about
    the camera is answered; its watch fires on the looped clip's red; another key's attach is
    refused (stream_not_found, 1008); deleting the stream closes the client (1000)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect as ws_connect

    with _http(demo_server) as http:
        stream_id = http.post("/v1/streams", json={
            "source": f"file://{clip}", "loop": True, "fps": 2,
            "config": {"sampling": {"max_tokens": 4}}}).json()["stream_id"]
        base = f"ws://{demo_server.host}:{demo_server.port}/v1/video/chat/stream?stream_id={stream_id}"
        with ws_connect(base + "&api_key=key-b") as stranger:
            refused = json.loads(stranger.recv(timeout=10))
            assert refused["type"] == "error" and refused["code"] == "stream_not_found"
            with pytest.raises(ConnectionClosed) as closed:
                stranger.recv(timeout=10)
            assert closed.value.rcvd.code == 1008

        with ws_connect(base + "&api_key=key-a") as ws:
            def until(kind: str, timeout_s: float = 60) -> dict[str, Any]:
                deadline = time.monotonic() + timeout_s
                while True:
                    event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
                    if event["type"] == kind or (event["type"] == "error" and kind != "error"):
                        return event

            assert json.loads(ws.recv(timeout=30))["type"] == "session.ready"
            assert until("video.frame.ack")["frame_id"].startswith("src_")
            ws.send(json.dumps({"type": "video.frame", "data": "AAAA", "frame_id": 1}))
            refused = until("error")
            assert refused["code"] == "invalid_message" and "stream" in refused["message"]
            ws.send(json.dumps({"type": "video.query", "text": "What colour is the screen?"}))
            assert until("response.done")["status"] == "completed"
            ws.send(json.dumps({"type": "watch.create", **RED_WATCH}))
            assert until("watch.created")["watch"]["watch_id"] == "red"
            fired = until("watch.fired", 60)
            assert fired["watch_id"] == "red" and fired["frame_id"].startswith("src_")
            assert http.get(f"/v1/streams/{stream_id}").json()["watches"][0]["condition"] == RED_WATCH["condition"]
            assert http.delete(f"/v1/streams/{stream_id}").status_code == 204
            with pytest.raises(ConnectionClosed) as ended:
                while True:
                    ws.recv(timeout=30)
            assert ended.value.rcvd.code == 1000
