"""OpenAI's Agents SDK (``@openai/agents-realtime``, unmodified from npm, bundled by the
project's setup) in Debian's Chromium, on a page served from another origin, calling
livesight over WebRTC as it would call OpenAI.

The page's own backend (this test's) mints an ephemeral key with livesight's
``/v1/realtime/client_secrets`` and a real API key; the key binds a red watch to the session.
The page hands ``OpenAIRealtimeWebRTC`` livesight's base URL, its fake microphone (a spoken
question, then silence) and, through ``changePeerConnection``, its fake camera (the colours
model's screen: grey, then red). The watch fires unasked on the camera track; the spoken
question is heard and answered, in words on the data channel and in sound on the call's audio
track. Runs on the colours demo model; needs /usr/bin/chromium and the bundle (``make setup``).
"""

from __future__ import annotations

import json
import threading
import time
import wave
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from playwright.sync_api import expect, sync_playwright

from server.background import RunningServer, run_server
from server.bench.spoken import speak_clip
from server.models.colour_frames import ColourScene
from server.settings import Settings
from server.speech.wav import Pcm, resample
from tests.colours_models import ShippedModels
from tests.heavy.browser.test_browser import CHROMIUM, CHROMIUM_FLAGS, wait_for

pytestmark = pytest.mark.timeout(300)

PAGE_DIR = Path(__file__).resolve().parent / "agents"
BUNDLE = PAGE_DIR / "build" / "agents-realtime.js"
API_KEY = "backend-only-key"
RED_WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 120}
CAMERA_FPS = 10
SCENES = (("grey", 4.0), ("red", 4.0))


def write_screen_y4m(dst: Path) -> None:
    """The colours model's screen, grey then red, at ``CAMERA_FPS`` (Chromium loops it)."""
    scene = ColourScene(np.random.default_rng(5), (320, 240))
    with dst.open("wb") as out:
        out.write(f"YUV4MPEG2 W320 H240 F{CAMERA_FPS}:1 Ip A1:1 C420jpeg\n".encode())
        n = 0
        for colour, seconds in SCENES:
            for _ in range(round(seconds * CAMERA_FPS)):
                rgb = scene.frame(colour, n, None).pixels
                yuv = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24").reformat(format="yuv420p")
                out.write(b"FRAME\n" + yuv.to_ndarray().tobytes())
                n += 1


def write_question_wav(dst: Path) -> None:
    """A spoken question after 2 s of quiet, then 40 s of quiet (Chromium loops the file)."""
    clip = speak_clip("what colour is the screen", lead_ms=2000, tail_ms=40_000, noise=20, seed=4)
    with wave.open(str(dst), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48_000)
        out.writeframes(resample(Pcm(clip.pcm16, 16_000), 48_000).samples)


def screen_browser(playwright: Any, folder: Path) -> Any:
    """Chromium whose camera is the colours model's screen and whose microphone asks a question
    (files written in ``folder``). Asserts (never skips) that Chromium is installed."""
    assert CHROMIUM.exists(), "Chromium is missing: apt-get install -y chromium"
    video, audio = folder / "screen.y4m", folder / "question.wav"
    write_screen_y4m(video)
    write_question_wav(audio)
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
        *CHROMIUM_FLAGS, "--disable-features=WebRtcHideLocalIpsWithMdns",
        f"--use-file-for-fake-video-capture={video}", f"--use-file-for-fake-audio-capture={audio}"])


class PageSite:
    """The web app: its page, the SDK bundle, and its backend's ``POST /key``."""

    def __init__(self, livesight: str) -> None:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                files = {"/": PAGE_DIR / "page.html", "/agents-realtime.js": BUNDLE}
                path = files.get(self.path)
                if path is None:
                    self.send_error(404)
                    return
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if path.suffix == ".html" else "text/javascript")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                minted = httpx.post(f"{site.livesight}/v1/realtime/client_secrets", timeout=30,
                                    headers={"Authorization": f"Bearer {API_KEY}"},
                                    json={"session": {"type": "realtime", "max_output_tokens": 6,
                                                      "livesight": {"watches": [RED_WATCH], "camera_fps": 2}}})
                site.minted.append(minted.status_code)
                body = minted.content
                self.send_response(minted.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.livesight = livesight
        self.minted: list[int] = []
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> PageSite:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def site_and_server(colours_models: ShippedModels) -> Iterator[tuple[PageSite, RunningServer]]:
    """The page's site, and livesight on the demo model admitting that site's origin."""
    assert BUNDLE.is_file(), f"{BUNDLE} is missing: `make setup` bundles @openai/agents-realtime"
    model = colours_models.get("qwen2_5_vl").path
    with PageSite("") as site:
        settings = Settings(model=str(model), resume_grace_s=0, api_keys=[API_KEY], allowed_origins=[site.origin])
        with run_server(settings) as server:
            site.livesight = server.http_url
            yield site, server


def test_the_agents_sdk_calls_over_webrtc_with_an_ephemeral_key_and_a_camera(
    site_and_server: tuple[PageSite, RunningServer], tmp_path: Path,
) -> None:
    """The SDK connects (its POST and preflight from another origin), the watch fires unasked
    on the camera track, the spoken question is answered in words and in sound."""
    site, server = site_and_server
    with sync_playwright() as playwright:
        browser = screen_browser(playwright, tmp_path)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc) + " " + str(exc.stack)[:3000]))
            page.goto(site.origin + "/")
            page.evaluate(f"start({json.dumps(server.http_url)})")

            def events() -> list[dict[str, Any]]:
                failure = page.evaluate("window.failure")
                assert failure is None, failure
                return page.evaluate("window.events")

            def kinds() -> list[str]:
                return [e.get("type") for e in events()]

            wait_for(lambda: "session.updated" in kinds(), 60, "the call's session.updated")
            assert site.minted == [200] and page.evaluate("window.callId").startswith("rtc_")
            updated = next(e for e in events() if e["type"] == "session.updated")
            assert [w["watch_id"] for w in updated["session"]["livesight"]["watches"]] == ["red"]  # the key's

            def fired() -> bool:
                return any(e["type"] == "response.done" and (e["response"].get("metadata") or {}).get("watch_id") == "red"
                           for e in events())

            wait_for(fired, 90, "the red watch's answer, unasked")
            wait_for(lambda: "input_audio_buffer.speech_stopped" in kinds(), 90, "the spoken question heard")

            def answered() -> list[dict[str, Any]]:
                stopped = kinds().index("input_audio_buffer.speech_stopped")
                return [e for e in events()[stopped:] if e["type"] == "response.done"
                        and not (e["response"].get("metadata") or {}).get("livesight_trigger")]

            wait_for(lambda: bool(answered()), 90, "the question's answer")
            done = answered()[0]
            words = [c.get("transcript") or c.get("text") for item in done["response"]["output"]
                     for c in item.get("content", [])]
            assert any(words), done
            # the answers' sound, decoded by the browser from the call's track (the analyser may
            # have started after a short answer played: the receiver's decoded energy counts it all)
            wait_for(lambda: page.evaluate("window.audioIn()")["energy"] > 0.005 or page.evaluate("window.heard") >= 5,
                     30, "the answer's sound on the call's track")
            assert "response.output_audio.delta" not in kinds()  # sound comes on the track, not the channel
            # Chromium answered the keyframe requests: the frames between the kept ones were never decoded
            frames = httpx.get(f"{server.http_url}/metrics.json", headers={"Authorization": f"Bearer {API_KEY}"}).json()
            frames = frames["webrtc"]["camera_frames"]
            assert frames["keyframe_requests"] > 0 and frames["not_decoded"] > frames["decoded"] > 3, frames
            assert not errors, errors
        finally:
            browser.close()
    time.sleep(0)  # the call ends with the page; the server's teardown checks nothing is left


def test_the_project_page_streams_over_webrtc_with_a_key_the_server_mints_and_falls_back(
    site_and_server: tuple[PageSite, RunningServer], tmp_path: Path,
) -> None:
    """livesight's own page, on its default transport: it asks the server for an ephemeral key
    (with the API key set in its settings), offers the call with that key alone, and speaks v1
    on the call's channel while the camera and microphone go as tracks. A watch added before
    Start fires on the camera track; a question is answered in words, and aloud on the call's
    audio track; Stop hangs up. When the server refuses calls, the page streams over the
    WebSocket instead."""
    _, server = site_and_server
    with sync_playwright() as playwright:
        browser = screen_browser(playwright, tmp_path)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            sent: list[tuple[str, str]] = []  # (path, Authorization) of the page's POSTs
            page.on("request", lambda r: r.method == "POST" and sent.append(
                (r.url.split("://", 1)[1].split("/", 1)[1], r.headers.get("authorization", ""))))
            page.goto(server.http_url + "/")
            page.wait_for_function("window.livesight !== undefined")
            assert page.locator("#transport").input_value() == "webrtc"
            page.fill("#api-key", API_KEY)
            page.check("#speak")
            page.fill("#max-tokens", "6")
            page.fill("#watch-condition", "Is the screen red?")
            page.click("#watch-add")
            page.click("#start")
            expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready", timeout=60_000)
            expect(page.locator("#r-transport")).to_have_text("WebRTC")
            assert sent[:2] == [("v1/realtime/client_secrets", f"Bearer {API_KEY}"),
                                ("v1/video/chat/calls", sent[1][1])] and sent[1][1].startswith("Bearer ek_"), sent

            alert = page.locator("#alerts .alert").last
            expect(alert).to_have_attribute("data-status", "completed", timeout=90_000)
            expect(alert.locator(".condition")).to_have_text("Is the screen red?")
            expect(page.locator("#r-accepted")).not_to_have_text("0")
            page.fill("#question", "What colour is the screen?")
            page.press("#question", "Enter")
            answer = page.locator("#answers .answer").first
            expect(answer).to_have_attribute("data-status", "completed", timeout=60_000)
            assert answer.locator(".answer-text").inner_text().strip()
            energy = """async () => {
                const pc = window.livesight.app.call.link?.pc;
                let energy = 0;
                if (pc) (await pc.getStats()).forEach((r) => {
                  if (r.type === "inbound-rtp" && r.kind === "audio") energy = r.totalAudioEnergy || 0;
                });
                return energy;
            }"""
            wait_for(lambda: page.evaluate(energy) > 0.001, 30, "the answers' voice on the call's audio track")
            assert page.evaluate("window.livesight.app.eventCounts['response.output_audio.delta']") is None
            metrics = httpx.get(f"{server.http_url}/metrics.json", headers={"Authorization": f"Bearer {API_KEY}"}).json()
            assert metrics["webrtc"]["camera_frames"]["decoded"] > 3, metrics["webrtc"]

            page.click("#stop-stream")
            expect(page.locator("#conn-state")).to_have_attribute("data-state", "idle")
            wait_for(lambda: any(p.startswith("v1/video/chat/calls/rtc_") and p.endswith("/hangup") for p, _ in sent),
                     10, "the call hung up")

            # A server that takes no calls: the page says so and streams over the WebSocket.
            page.route("**/v1/video/chat/calls", lambda route: route.fulfill(status=404, body="not here"))
            accepted = int(page.locator("#r-accepted").inner_text())
            page.click("#start")
            expect(page.locator("#r-transport")).to_have_text("WebSocket", timeout=30_000)
            expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready")
            expect(page.locator("#error")).to_contain_text("WebRTC call could not be made")
            wait_for(lambda: int(page.locator("#r-accepted").inner_text()) > accepted, 30, "frames over the WebSocket")
            page.click("#stop-stream")
            assert not errors, errors
        finally:
            browser.close()


def test_the_page_lists_the_servers_cameras_and_watches_one(
    site_and_server: tuple[PageSite, RunningServer], tmp_path: Path,
) -> None:
    """A camera the server pulls (a looped clip of the colours model's screen, red then grey)
    is listed on the page; Watch attaches the page's session to it (no camera of the page's
    own): its frames are counted, a question about it is answered, an alert added there fires;
    Stop watching lets it go, and the stream goes on."""
    from server.bench.footage import write_colour_clip

    _, server = site_and_server
    clip = tmp_path / "porch.mp4"
    write_colour_clip(clip, [("red", 4.0), ("grey", 4.0)], fps=10)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    created = httpx.post(f"{server.http_url}/v1/streams", headers=headers, timeout=30, json={
        "source": f"file://{clip}", "loop": True, "name": "porch", "config": {"sampling": {"max_tokens": 6}}})
    assert created.status_code == 201, created.text
    stream_id = created.json()["stream_id"]
    assert CHROMIUM.exists(), "Chromium is missing: apt-get install -y chromium"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page()
                page.set_default_timeout(20_000)
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(server.http_url + "/")
                page.wait_for_function("window.livesight !== undefined")
                page.fill("#api-key", API_KEY)
                page.click("#streams-refresh")
                item = page.locator(f'#streams li[data-stream-id="{stream_id}"]')
                expect(item).to_contain_text("porch")
                item.locator("button.watch-stream").click()
                expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready")
                expect(page.locator("#r-transport")).to_contain_text("server's camera")
                expect(page.locator("#r-accepted")).not_to_have_text("0")
                assert page.evaluate("window.livesight.app.stream") is None  # no camera of its own
                page.fill("#question", "What colour is the screen?")
                page.press("#question", "Enter")
                answer = page.locator("#answers .answer").first
                expect(answer).to_have_attribute("data-status", "completed", timeout=60_000)
                page.fill("#watch-condition", "Is the screen red?")
                page.press("#watch-condition", "Enter")
                alert = page.locator("#alerts .alert").last
                expect(alert).to_have_attribute("data-status", "completed", timeout=60_000)
                page.click("#streams-leave")
                expect(page.locator("#conn-state")).to_have_attribute("data-state", "idle")
                assert not errors, errors
            finally:
                browser.close()
        status = httpx.get(f"{server.http_url}/v1/streams/{stream_id}", headers=headers, timeout=30).json()
        assert status["state"] == "live" and status["fires"] >= 1, status
    finally:
        httpx.delete(f"{server.http_url}/v1/streams/{stream_id}", headers=headers, timeout=30)
