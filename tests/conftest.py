"""Shared fixtures: a tiny generated model, a real server on a real socket, a client."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# No load shedding in the suite's servers (in-process and `livesight serve` children alike): the
# suite shares two cores with Chromium and vLLM, and a frame shed there makes exact frame counts
# flaky. Shedding is pinned by tests that set intake_max_wait_ms themselves (test_settings_wiring)
# and by the read-ahead budgets (test_intake_faults), which this does not touch.
os.environ.setdefault("LIVESIGHT_INTAKE_MAX_WAIT_MS", "60000")

from server.background import RunningServer, ServerAddress, run_server  # noqa: E402
from server.client.connection import Connection, Received  # noqa: E402
from server.settings import Settings  # noqa: E402
from server.models.tiny import make_tiny_model  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo model family, generated once per test run."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), family="qwen2_5_vl")


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """The real server with the real transformers engine on the tiny model."""
    # No resume here: a test that drops a connection must not leave a parked session (and its
    # frames) behind for the next test's leak checks; tests/session/test_resume.py has its own server.
    settings = Settings(model=str(tiny_model_dir), max_sessions=64, resume_grace_s=0)
    with run_server(settings) as running:
        yield running


# ---------------------------------------------------------------------- media


def jpeg_frame(seed: int = 0, size: tuple[int, int] = (320, 240), quality: int = 80) -> bytes:
    """A JPEG of a random smooth picture (different seeds differ a lot)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize(size, Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ---------------------------------------------------------------------- client


class Client(Connection):
    """The package's protocol client with each event as a dict, every field as on the wire.

    Every event is parsed by ``parse_server_event`` too: one the protocol does not know fails
    the test (``UnknownEvent``). Messages go out as the test writes them (often invalid on
    purpose), not through the typed senders.
    """

    def __init__(self, ws: Any) -> None:
        super().__init__(ws)
        self.events: list[dict[str, Any]] = []

    async def receive(self, timeout: float | None = None) -> Received:
        received = await super().receive(timeout)
        self.events.append(received.data)
        return received

    async def send(self, **message: Any) -> None:
        await self.send_raw(json.dumps(message))

    async def recv(self, timeout: float = 60) -> dict[str, Any]:
        return (await self.receive(timeout)).data

    async def recv_type(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        """Skip events until one of type ``kind`` arrives; returns it."""
        return (await self.wait_for(kind, timeout)).data

    async def collect_until(self, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
        """Every event up to and including the first of type ``kind``."""
        return [received.data for received in await self.receive_until(kind, timeout)]

    async def frame(self, frame_id: Any, seed: int | None = None, **fields: Any) -> dict[str, Any]:
        """Send a frame and return its ack."""
        data = jpeg_frame(seed if seed is not None else hash(str(frame_id)) % 10_000)
        await self.send(type="video.frame", data=b64(data), frame_id=frame_id, **fields)
        return await self.recv_type("video.frame.ack")

    async def ask(self, text: str, **fields: Any) -> list[dict[str, Any]]:
        """Ask a question and return every event up to its ``response.done``."""
        await self.send(type="video.query", text=text, **fields)
        return await self.collect_until("response.done", timeout=120)


async def connect(server: ServerAddress, **config: Any) -> tuple[Client, dict[str, Any]]:
    """Open a session; returns the client and its ``session.ready``."""
    client, ready = await Client.open(server.ws_url, config, open_timeout=120)
    return client, ready.data


_MODULE_MODEL: list[Path] = []


def tiny_model_path_for_module() -> str:
    """The session's tiny model path for tests that start their own server."""
    return str(_MODULE_MODEL[0])


@pytest.fixture(scope="session", autouse=True)
def _remember_model(tiny_model_dir: Path) -> None:
    _MODULE_MODEL.append(tiny_model_dir)


@pytest.fixture(scope="session")
def idefics3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Idefics3 (SmolVLM's family): the model vLLM loads natively, no torchvision needed."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-idefics3"), family="idefics3")
