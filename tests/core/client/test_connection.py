"""The package's protocol client (server/client/connection.py): what its typed senders put on the
wire and how it reads events back (a session with the real server: tests/socket/client/test_stream_client.py)."""

from __future__ import annotations

import json

import pytest

from handlers.wire.protocol import FrameAck, parse_client_event
from server.client.connection import Connection, UnknownEvent, audio_chunk, collect_until, video_frame

pytestmark = pytest.mark.anyio


class _Socket:
    """A socket that replays ``incoming`` and keeps what is sent."""

    def __init__(self, *incoming: str) -> None:
        self.incoming = list(incoming)
        self.sent: list[str] = []

    async def recv(self) -> str:
        return self.incoming.pop(0)

    async def send(self, raw: str) -> None:
        self.sent.append(raw)


async def test_typed_senders_write_what_the_server_parses() -> None:
    """Every typed sender's message parses on the server's side into the same event; a frame
    without an id or time carries no null fields."""
    ws = _Socket()
    conn = Connection(ws)
    frame = await conn.send_frame(b"\xff\xd8jpeg", frame_id="f1", pts_ms=40)
    await conn.send_audio(b"\x00\x01" * 4)
    await conn.query("what now?")
    await conn.cancel()
    await conn.finish()
    await conn.ping()
    await conn.send_frame("aGk=")
    parsed = [parse_client_event(raw, configured=True) for raw in ws.sent]
    assert [p.type for p in parsed] == [
        "video.frame", "audio.chunk", "video.query", "response.cancel", "video.done", "ping", "video.frame",
    ]
    assert parsed[0] == frame and parsed[1] == audio_chunk(b"\x00\x01" * 4)
    assert json.loads(ws.sent[-1]) == {"type": "video.frame", "data": "aGk="}
    assert video_frame(b"x").data == "eA=="


async def test_events_are_typed_and_unknown_ones_are_refused() -> None:
    """A server event is read as its model (its wire form kept as a dict); a message that is
    no protocol v1 event raises UnknownEvent; waits stop at the first match."""
    ack = {"type": "video.frame.ack", "frame_id": 7, "accepted": True, "buffered_frames": 1,
           "server_receive_ts_ms": 1.5, "future_field": 1}
    conn = Connection(_Socket(json.dumps(ack), '{"type": "pong"}', '{"type": "video.frame.acked"}'))
    received = await conn.receive(1)
    assert isinstance(received.event, FrameAck) and received.event.frame_id == 7
    assert received.data == ack and received.type == "video.frame.ack"
    assert [r.type for r in await conn.receive_until("pong", 1)] == ["pong"]
    with pytest.raises(UnknownEvent):
        await conn.receive(1)


async def test_collect_until_keeps_one_deadline() -> None:
    """collect_until passes each call the time left and stops at the first accepted item."""
    asked: list[float] = []

    async def receive(left: float) -> int:
        asked.append(left)
        return len(asked)

    assert await collect_until(receive, lambda n: n == 3, 10) == [1, 2, 3]
    assert asked[0] <= 10 and asked == sorted(asked, reverse=True)
