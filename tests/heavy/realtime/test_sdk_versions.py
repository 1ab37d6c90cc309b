"""Every /v1/realtime server event parses in the typed models of both openai SDKs livesight
follows: 2.54 (in a virtual environment of its own, installed from tests/heavy/realtime/openai-2.txt,
since livekit-agents needs openai>=3.19) and the 3.x of the project's environment. The same
conversation script (sdk_events.py) runs under each against the real server."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from server.background import RunningServer
from tests.protocol_client import jpeg_frame

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def openai_2_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh virtual environment with only openai 2.54 (from openai-2.txt)."""
    where = tmp_path_factory.mktemp("openai-2")
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "-r", HERE / "openai-2.txt"], check=True, timeout=600)
    return python


def _run(python: Path, server: RunningServer, tmp_path: Path) -> dict:
    images = []
    for seed in range(2):
        path = tmp_path / f"frame{seed}.jpg"
        path.write_bytes(jpeg_frame(seed + 20))
        images.append(str(path))
    done = subprocess.run(
        [python, HERE / "sdk_events.py", f"{server.http_url}/v1", *images],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


EXPECTED = {
    "session.created", "session.updated", "conversation.item.added", "conversation.item.done",
    "response.created", "response.output_item.added", "response.content_part.added",
    "response.output_audio.delta", "response.output_audio_transcript.delta", "response.done",
    "conversation.item.truncated", "conversation.item.retrieved", "output_audio_buffer.cleared",
    "conversation.item.deleted", "response.output_text.delta", "error",
}


def test_every_event_parses_in_openai_2(openai_2_python: Path, server: RunningServer, tmp_path: Path) -> None:
    """openai 2.54 types every event of a conversation with frames, a seeded assistant item,
    audio out, truncate, retrieve, an out-of-band response, clear, delete and an error."""
    result = _run(openai_2_python, server, tmp_path)
    assert result["openai"] == "2.54.0" and EXPECTED <= set(result["seen"])


def test_every_event_parses_in_the_projects_openai(server: RunningServer, tmp_path: Path) -> None:
    """The same conversation under the project's own (3.x) SDK."""
    result = _run(Path(sys.executable), server, tmp_path)
    assert result["openai"].startswith("3.") and EXPECTED <= set(result["seen"])
