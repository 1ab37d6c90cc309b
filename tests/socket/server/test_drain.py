"""Graceful drain: a real `livesight serve` process and SIGTERM during an answer."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from server.background import ServedProcess, serve_process
from tests.protocol_client import b64, Client, jpeg_frame

pytestmark = pytest.mark.anyio
DRAIN_S = 30


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedProcess]:
    """`livesight serve` in its own process (JSON logs to a file); killed if the test leaves it running."""
    args = ["--model", str(tiny_model_dir), "--drain-timeout-s", str(DRAIN_S), "--log-format", "json"]
    with serve_process(args, log_path=tmp_path / "server.log", start_timeout_s=180, stop_timeout_s=0) as served:
        yield served


async def _open(served: ServedProcess) -> Client:
    config = {"prefix_warmup": False, "sampling": {"max_tokens": 300, "temperature": 1.0, "seed": 5}}
    client, _ = await Client.open(served.ws_url, config)
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
    proc = served.proc
    talker, idle = await _open(served), await _open(served)
    await talker.send(type="video.frame", data=b64(jpeg_frame(3)), frame_id=1)
    await talker.recv_type("video.frame.ack")
    await talker.send(type="video.query", text="Describe everything at length.")
    await talker.recv_type("response.text.delta")
    proc.send_signal(signal.SIGTERM)

    idle_events, idle_code = await _until_closed(idle)
    assert [e["type"] for e in idle_events] == ["session.closing"] and idle_code == 1012
    assert idle_events[0]["deadline_ms"] == DRAIN_S * 1000
    try:  # while the answer runs, no new session is taken
        ws = await websockets.connect(served.ws_url, open_timeout=5)
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
    lines = [json.loads(line) for line in served.log().splitlines() if line.startswith("{")]
    assert any("draining 2 sessions" in line["message"] for line in lines)
    assert any(line.get("request_id") == done["request_id"] for line in lines)  # the answer's log line
