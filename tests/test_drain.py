"""Graceful drain: a real `livesight serve` process and SIGTERM during an answer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import Client, b64, jpeg_frame

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent
DRAIN_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """`livesight serve` in its own process (JSON logs to a file); killed if the test leaves it running."""
    port = _free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port),
             "--drain-timeout-s", str(DRAIN_S), "--log-format", "json"],
            cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield proc, port, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _open(port: int) -> Client:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/video/chat/stream", max_size=None)
    client = Client(ws)
    await client.send(type="session.config", prefix_warmup=False, sampling={"max_tokens": 300, "temperature": 1.0, "seed": 5})
    assert (await client.recv())["type"] == "session.ready"
    return client


async def _until_closed(client: Client, timeout: float = 60) -> tuple[list[dict], int | None]:
    """Every event until the server closes the connection, and the close code."""
    events = []
    try:
        while True:
            events.append(await client.recv(timeout))
    except websockets.ConnectionClosed as closed:
        return events, closed.rcvd.code if closed.rcvd else None


async def test_sigterm_lets_the_answer_finish_then_closes_with_1012(served) -> None:
    """SIGTERM mid-answer: session.closing (deadline), the answer completes, close 1012; new
    connections are refused meanwhile; the process exits cleanly, its JSON log says it drained."""
    proc, port, log_path = served
    talker, idle = await _open(port), await _open(port)
    await talker.send(type="video.frame", data=b64(jpeg_frame(3)), frame_id=1)
    await talker.recv_type("video.frame.ack")
    await talker.send(type="video.query", text="Describe everything at length.")
    await talker.recv_type("response.text.delta")
    proc.send_signal(signal.SIGTERM)

    idle_events, idle_code = await _until_closed(idle)
    assert [e["type"] for e in idle_events] == ["session.closing"] and idle_code == 1012
    assert idle_events[0]["deadline_ms"] == DRAIN_S * 1000
    try:  # while the answer runs, no new session is taken
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/video/chat/stream", open_timeout=5)
    except (OSError, websockets.InvalidHandshake, TimeoutError):
        pass
    else:
        refused, code = await _until_closed(Client(ws))
        assert [e.get("code") for e in refused] == ["server_closing"] and code == 1012

    events, code = await _until_closed(talker)
    kinds = [e["type"] for e in events]
    assert "session.closing" in kinds and kinds.index("session.closing") < kinds.index("response.done"), kinds
    done = next(e for e in events if e["type"] == "response.done")
    assert done["status"] == "completed" and done["usage"]["completion_tokens"] > 0
    assert code == 1012
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has stopped
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert any("draining 2 sessions" in line["message"] for line in lines)
    assert any(line.get("request_id") == done["request_id"] for line in lines)  # the answer's log line
