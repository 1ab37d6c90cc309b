"""The client side of protocol v1 in one place: a ``Connection`` sends typed client events and
reads the server's events back typed, with ``parse_server_event``.

    conn, ready = await Connection.open("ws://127.0.0.1:8000/v1/video/chat/stream", {"num_frames": 4})
    await conn.send_frame(jpeg_bytes, frame_id=1)
    ack = await conn.wait_for("video.frame.ack")
    events = await conn.answer("what do you see?")  # every event up to its response.done
    await conn.close()

``livesight stream`` (``server.client.stream.StreamClient``), the benchmarks and the tests all speak
the protocol through it. Each event read is a ``Received``: the typed ``event``, its ``raw``
text (``data`` is that text as a dict, for the tests that pin the wire itself) and ``at``,
when it was read (``time.perf_counter``). An event this protocol does not know raises
``UnknownEvent``: the tests fail on it, ``StreamClient`` passes over it (a newer server).

Reading is pulled, one event at a time (``receive``): a client that stops reading leaves
the events in the socket, so the server's backpressure is what a real slow client gets.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, Self, TypeVar, cast
from urllib.parse import quote

import websockets
from pydantic import ValidationError

from handlers.wire.errors import ErrorCode
from handlers.wire.protocol import (
    AnyServerEvent,
    AudioChunkIn,
    ErrorEvent,
    FrameAck,
    FrameId,
    FramesConsumed,
    Ping,
    ResponseCancel,
    ResponseDone,
    ResponseTextDelta,
    SessionReady,
    VideoDone,
    VideoFrame,
    VideoQuery,
    parse_server_event,
)

#: What ends a wait: an event type, or a test on the typed event.
Match = str | Callable[[AnyServerEvent], bool]
#: The client events sent typed (``session.config`` goes out as the caller wrote it).
ClientMessage = VideoFrame | AudioChunkIn | VideoQuery | ResponseCancel | VideoDone | Ping
T = TypeVar("T")
E = TypeVar("E")


class StreamError(Exception):
    """The server refused or ended the session; ``code`` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class UnknownEvent(ValueError):
    """The server sent a message that is not an event of protocol v1 (``raw`` holds it)."""

    def __init__(self, raw: str | bytes, reason: str) -> None:
        super().__init__(f"not a protocol v1 server event ({reason}): {str(raw)[:200]}")
        self.raw = raw


@dataclass
class Received(Generic[E]):
    """One server event as read: typed, as sent, and when."""

    event: E
    raw: str | bytes
    at: float = field(default_factory=time.perf_counter)

    @property
    def type(self) -> str:
        return self.event.type

    @cached_property
    def data(self) -> dict[str, Any]:
        """The event as the server wrote it (a dict, every field as on the wire)."""
        return json.loads(self.raw)


@dataclass(frozen=True)
class TimedAnswer:
    """An answer timed at the client: ``first_output_ms`` from sending the question to the
    first ``video.frames.consumed`` or text delta (NaN when neither came)."""

    first_output_ms: float
    done: ResponseDone


def video_frame(
    image: bytes | str, *, frame_id: FrameId | None = None, pts_ms: float | None = None, **fields: Any
) -> VideoFrame:
    """The ``video.frame`` event of one encoded image (a ``str`` is already base64).
    Raises ``pydantic.ValidationError`` for a field the protocol would refuse."""
    data = image if isinstance(image, str) else base64.b64encode(image).decode("ascii")
    return VideoFrame(type="video.frame", data=data, frame_id=frame_id, pts_ms=pts_ms, **fields)


def audio_chunk(pcm16: bytes) -> AudioChunkIn:
    """The ``audio.chunk`` event of PCM16 little-endian mono 16 kHz audio."""
    return AudioChunkIn(type="audio.chunk", data=base64.b64encode(pcm16).decode("ascii"))


async def collect_until(
    receive: Callable[[float], Awaitable[T]], is_last: Callable[[T], bool], timeout: float
) -> list[T]:
    """What ``receive(seconds_left)`` returns, up to and including the first that ``is_last``
    accepts, all within ``timeout`` seconds. Raises ``TimeoutError`` (and what ``receive`` raises)."""
    out: list[T] = []
    deadline = time.monotonic() + timeout
    while True:
        out.append(await receive(max(0.01, deadline - time.monotonic())))
        if is_last(out[-1]):
            return out


def matcher(match: Match) -> Callable[[AnyServerEvent], bool]:
    """``match`` as a test on a typed event."""
    return (lambda event: event.type == match) if isinstance(match, str) else match


class Connection:
    """One WebSocket connection to ``/v1/video/chat/stream``, client side. Open a session with
    ``Connection.open``, or wrap a socket opened elsewhere (``Connection(ws)``)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(
        cls, url: str, config: dict[str, Any] | None = None, *, api_key: str | None = None,
        open_timeout: float = 30, **connect: Any,
    ) -> tuple[Self, Received[SessionReady]]:
        """Connect and send ``session.config`` with ``config`` (sent as given: the server judges
        it); returns the connection and its ``session.ready``.
        A ``resume_failed`` error is passed over: the server starts a new session after it.
        ``connect``: more ``websockets.connect`` arguments (headers, compression).

        Raises ``StreamError`` when the server refuses the session, ``OSError``, ``TimeoutError``
        or ``websockets.InvalidURI``/``InvalidHandshake`` when it cannot be reached.
        """
        if api_key:
            url += ("&" if "?" in url else "?") + "api_key=" + quote(api_key, safe="")
        ws = await websockets.connect(url, max_size=None, open_timeout=open_timeout, **connect)
        conn = cls(ws)
        try:
            await conn.send_raw(json.dumps({"type": "session.config", **(config or {})}))
            first = await conn.receive(open_timeout)
            if isinstance(first.event, ErrorEvent) and first.event.code == ErrorCode.RESUME_FAILED:
                first = await conn.receive(open_timeout)
            if isinstance(first.event, ErrorEvent):
                raise StreamError(first.event.code, first.event.message)
            if not isinstance(first.event, SessionReady):
                raise StreamError("unexpected", f"{first.type} before session.ready")
        except BaseException:
            await ws.close()
            raise
        return conn, cast("Received[SessionReady]", first)

    # ------------------------------------------------------------------ sending
    async def send_event(self, event: ClientMessage) -> None:
        """Send one typed client event (``VideoFrame``, ``VideoQuery``...)."""
        await self.ws.send(event.model_dump_json(exclude_none=True))

    async def send_raw(self, raw: str | bytes) -> None:
        """Send a message as it is (a test's or a fuzzer's hand-made one)."""
        await self.ws.send(raw)

    async def send_frame(
        self, image: bytes | str, *, frame_id: FrameId | None = None, pts_ms: float | None = None, **fields: Any
    ) -> VideoFrame:
        """Send one encoded image (JPEG/PNG/WebP; a ``str`` is already base64); returns the
        ``video.frame`` sent."""
        frame = video_frame(image, frame_id=frame_id, pts_ms=pts_ms, **fields)
        await self.send_event(frame)
        return frame

    async def send_audio(self, pcm16: bytes) -> None:
        """Send PCM16 little-endian mono 16 kHz audio (``audio.chunk``)."""
        await self.send_event(audio_chunk(pcm16))

    async def query(self, text: str, **fields: Any) -> None:
        """Send ``video.query`` (``fields``: ``audio_data``)."""
        await self.send_event(VideoQuery(type="video.query", text=text, **fields))

    async def cancel(self) -> None:
        """Send ``response.cancel``."""
        await self.send_event(ResponseCancel(type="response.cancel"))

    async def finish(self) -> None:
        """Send ``video.done`` (the server answers ``session.done`` once the answer has ended)."""
        await self.send_event(VideoDone(type="video.done"))

    async def ping(self) -> None:
        await self.send_event(Ping(type="ping"))

    async def close(self) -> None:
        await self.ws.close()

    # ------------------------------------------------------------------ receiving
    async def receive(self, timeout: float | None = None) -> Received[AnyServerEvent]:
        """The next server event. Raises ``TimeoutError``, ``websockets.ConnectionClosed``
        and ``UnknownEvent``."""
        async with asyncio.timeout(timeout):
            raw = await self.ws.recv()
        try:
            return Received(parse_server_event(raw), raw)
        except ValidationError as exc:
            raise UnknownEvent(raw, f"{exc.error_count()} errors") from None

    async def events(self, *, skip_unknown: bool = False) -> AsyncIterator[Received]:
        """Every event until the connection closes (its code is then ``self.ws.close_code``)."""
        while True:
            try:
                yield await self.receive()
            except websockets.ConnectionClosed:
                return
            except UnknownEvent:
                if not skip_unknown:
                    raise

    async def receive_until(self, last: Match, timeout: float = 60) -> list[Received]:
        """Every event up to and including the first that ``last`` matches. Raises
        ``TimeoutError`` and ``websockets.ConnectionClosed``."""
        is_last = matcher(last)
        return await collect_until(self.receive, lambda received: is_last(received.event), timeout)

    async def wait_for(self, match: Match, timeout: float = 60) -> Received:
        """The first event that ``match`` matches (the ones before it are passed over)."""
        return (await self.receive_until(match, timeout))[-1]

    async def answer(self, text: str, timeout: float = 120, **fields: Any) -> list[Received]:
        """Ask ``text``; returns every event up to its ``response.done``."""
        await self.query(text, **fields)
        return await self.receive_until("response.done", timeout)

    async def ask_timed(self, text: str, timeout: float = 300) -> TimedAnswer:
        """Ask ``text`` and time its first output at the client; returns at ``response.done``."""
        sent = time.perf_counter()
        first = float("nan")
        for received in await self.answer(text, timeout):
            if math.isnan(first) and isinstance(received.event, FramesConsumed | ResponseTextDelta):
                first = (received.at - sent) * 1000
        assert isinstance(received.event, ResponseDone)
        return TimedAnswer(first, received.event)

    async def wait_acks(self, count: int, timeout: float = 600) -> list[FrameAck]:
        """The next ``count`` frame acks. Raises ``StreamError`` on an ``error`` event."""
        acks: list[FrameAck] = []
        deadline = time.monotonic() + timeout
        while len(acks) < count:
            event = (await self.receive(max(0.01, deadline - time.monotonic()))).event
            if isinstance(event, ErrorEvent):
                raise StreamError(event.code, event.message)
            if isinstance(event, FrameAck):
                acks.append(event)
        return acks
