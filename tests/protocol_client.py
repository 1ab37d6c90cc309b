"""The suite's side of the wire: JPEG frames, base64, and the protocol client as dicts.

Light on purpose (no server, no engine, no torch): the core and session tiers use it as much
as the tiers with a real server.
"""

from __future__ import annotations

import base64
import io
import json
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from server.client.connection import Connection, Received

if TYPE_CHECKING:
    from server.background import ServerAddress


def jpeg_frame(seed: int = 0, size: tuple[int, int] = (320, 240), quality: int = 80) -> bytes:
    """A JPEG of a random smooth picture (different seeds differ a lot)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize(size, Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def b64(data: bytes) -> str:
    """``data`` as the base64 text a ``video.frame`` or ``audio.chunk`` carries."""
    return base64.b64encode(data).decode("ascii")


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
