"""The resumable Python client of livesight (what ``livesight stream`` streams through).

``StreamClient`` is one session over ``websockets``::

    async with StreamClient.connect("ws://127.0.0.1:8000/v1/video/chat/stream") as client:
        await client.send_frame(jpeg_bytes, pts_ms=0)
        answer = await client.ask("what do you see?")
        await answer.wait()
        print(answer.text, answer.ttft_ms)

When the connection drops (anything but a normal close), the client reconnects and resumes
its session with the ``resume_token`` of ``session.ready`` (the server's ``resume_grace_s``):
the answers that were running end as ``interrupted``, and the frames the server had not taken
yet (after ``session.ready.last_frame_id``) are sent again from a short replay buffer. When
the session cannot be resumed (another server after a restart), a new one starts with the
same config and the replay buffer. ``resumes`` counts the reconnections.

Every connection of a client carries the same routing key in its URL (``?route=KEY``, random
per client unless given): a load balancer hashing on it (HAProxy ``balance url_param route``,
nginx ``hash $arg_route consistent``, Envoy ``hash_policy.query_parameter``) sends a reconnect
to the gateway that holds the parked session. The server itself ignores it.

Frame sources are in ``server.client.sources``; playing one into a client, as ``livesight
stream`` does, is ``server.client.runner``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import websockets

from handlers.wire.protocol import (
    AnyServerEvent,
    ErrorEvent,
    FrameAck,
    FramesConsumed,
    ResponseAudioDelta,
    ResponseCancel,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    SessionDone,
    SessionReady,
    VideoDone,
    VideoFrame,
    VideoQuery,
)
from server.client.connection import ClientMessage, Connection, StreamError, audio_chunk, video_frame

# A question without a `response.start` gets one of these instead (the server answers in order).
_REFUSALS = frozenset({"no_frames", "invalid_audio"})
RECONNECT_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)  # about 16 s in all: within the default grace of 30 s
Opener = Callable[[dict[str, Any]], Awaitable[tuple[Connection, SessionReady]]]


class AnswerListener(Protocol):
    """Follows one answer as it streams (called from the client's reader)."""

    def started(self, answer: Answer) -> None: ...

    def text(self, answer: Answer, delta: str) -> None: ...

    def finished(self, answer: Answer) -> None: ...


@dataclass
class Answer:
    """One question and its answer, filled in as the events arrive.

    ``ttft_ms`` and ``total_ms`` are measured here, from sending the question to the first
    text delta and to ``response.done``; ``server_timings`` are the server's own.
    """

    question: str
    video_time_s: float | None = None
    listener: AnswerListener | None = None
    sent_at: float = field(default_factory=time.perf_counter)
    request_id: str | None = None
    text: str = ""
    status: str | None = None  # completed, interrupted, failed; "refused" when it never started
    finish_reason: str | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    server_timings: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    frame_ids: list[Any] = field(default_factory=list)  # the named frames the prompt used
    frames_in_prompt: int = 0  # every frame the prompt used, named or not
    latest_pts_ms: float | None = None
    error: str | None = None
    audio_chunks: int = 0
    _done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def frames_used(self) -> int:
        return self.frames_in_prompt

    async def wait(self, timeout: float | None = None) -> Answer:
        """Wait for ``response.done`` (or the refusal); returns self. Raises ``TimeoutError``."""
        async with asyncio.timeout(timeout):
            await self._done.wait()
        return self

    def _finish(self, status: str) -> None:
        self.status = status
        self.total_ms = round((time.perf_counter() - self.sent_at) * 1000, 2)
        self._done.set()
        if self.listener:
            self.listener.finished(self)


@dataclass
class FrameStats:
    sent: int = 0
    accepted: int = 0
    filtered: int = 0  # like the frame before it
    shed: int = 0  # dropped by a busy server (``reason: "overloaded"``)


#: The query parameter of the routing key.
ROUTE_PARAM = "route"


def new_route() -> str:
    """A random routing key (URL-safe, 16 characters)."""
    return secrets.token_urlsafe(12)


def with_route(url: str, route: str) -> str:
    """``url`` carrying ``route`` as its routing key (replacing one it had)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != ROUTE_PARAM]
    return urlunsplit(parts._replace(query=urlencode([*query, (ROUTE_PARAM, route)])))


class StreamClient:
    """One livesight session over a ``Connection``. Create it with ``StreamClient.connect``."""

    def __init__(
        self, conn: Connection, ready: SessionReady, reopen: Opener | None = None, replay_frames: int = 64
    ) -> None:
        self.conn = conn
        self.ready = ready
        self.resumes = 0
        self._reopen = reopen  # opens a session (with extra config fields); None: no reconnection
        self._replay: deque[VideoFrame] = deque(maxlen=replay_frames)  # recent video.frame events
        self._connected = asyncio.Event()
        self._connected.set()
        self._closing = False
        self.frames = FrameStats()
        self.errors: list[dict[str, Any]] = []
        self._waiting: deque[Answer] = deque()
        self._running: dict[str, Answer] = {}
        self._frame_seq = 0
        self._session_done = asyncio.Event()

    @property
    def ws(self) -> Any:
        """The WebSocket of the current connection."""
        return self.conn.ws

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, url: str, config: dict[str, Any] | None = None, *, api_key: str | None = None, open_timeout: float = 30,
        resume: bool = True, replay_frames: int = 64, route: str | None = None,
    ) -> AsyncIterator[StreamClient]:
        """Open a session with ``config`` (the ``session.config`` fields); closes it on exit.
        With ``resume``, a dropped connection is resumed (see the module docstring). ``route``:
        the routing key every connection carries (default: a random one for this client).

        Raises ``StreamError`` when the server refuses the session, ``OSError`` or
        ``websockets.InvalidURI``/``InvalidHandshake`` when it cannot be reached.
        """

        routed = with_route(url, route or new_route())

        async def open_session(extra: dict[str, Any]) -> tuple[Connection, SessionReady]:
            conn, ready = await Connection.open(routed, {**(config or {}), **extra}, api_key=api_key,
                                                open_timeout=open_timeout)
            return conn, ready.event

        conn, ready = await open_session({})
        client = cls(conn, ready, open_session if resume else None, replay_frames)
        try:
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(client._read())
                try:
                    yield client
                finally:
                    client._closing = True
                    await client.ws.close()
                    await reader
        finally:
            await client.ws.close()

    # ------------------------------------------------------------------ sending
    async def send_frame(
        self, image: bytes, *, pts_ms: float | None = None, frame_id: int | str | None = None, **fields: Any
    ) -> int | str:
        """Send one encoded image (JPEG/PNG/WebP); returns its ``frame_id``."""
        if frame_id is None:
            self._frame_seq += 1
            frame_id = self._frame_seq
        frame = video_frame(image, frame_id=frame_id, pts_ms=pts_ms, capture_ts_ms=round(time.time() * 1000, 1),
                            **fields)
        self._replay.append(frame)
        self.frames.sent += 1
        await self._connected.wait()
        try:
            await self.conn.send_event(frame)
        except websockets.ConnectionClosed:
            if self._reopen is None:
                raise  # with resume on, the replay buffer sends it again
        return frame_id

    async def send_audio(self, pcm16: bytes) -> None:
        """Send PCM16 little-endian mono 16 kHz audio (buffered by the server until a question)."""
        await self._send(audio_chunk(pcm16))

    async def ask(
        self, question: str, *, listener: AnswerListener | None = None, video_time_s: float | None = None
    ) -> Answer:
        """Send ``video.query``; returns its ``Answer`` at once (``await answer.wait()`` for the end).

        A question asked while an answer runs interrupts that answer (the protocol's rule).
        """
        answer = Answer(question, video_time_s, listener)
        self._waiting.append(answer)
        await self._send(VideoQuery(type="video.query", text=question))
        return answer

    async def cancel(self) -> None:
        """Stop the running answer (``response.cancel``)."""
        await self._send(ResponseCancel(type="response.cancel"))

    async def finish(self, timeout: float = 120) -> None:
        """Send ``video.done`` and wait for ``session.done`` (the running answer completes first)."""
        await self._send(VideoDone(type="video.done"))
        async with asyncio.timeout(timeout):
            await self._session_done.wait()

    async def _send(self, event: ClientMessage) -> None:
        """Send an event; while a dropped connection is being resumed, wait for it first."""
        await self._connected.wait()
        try:
            await self.conn.send_event(event)
        except websockets.ConnectionClosed:
            if self._reopen is None:
                raise
            await asyncio.sleep(0)  # let the reader see the drop and start resuming
            await self._connected.wait()
            await self.conn.send_event(event)

    # ------------------------------------------------------------------ receiving
    async def _read(self) -> None:
        try:
            while True:
                # an event this client does not know (a newer server) is not ours to act on
                async for received in self.conn.events(skip_unknown=True):
                    self._on_event(received.event)
                dropped = self.ws.close_code != 1000 and not self._closing and not self._session_done.is_set()
                if not (dropped and self._reopen is not None and await self._resume()):
                    return
        finally:
            self._connected.set()  # nothing waits for a connection that will not come back
            for answer in [*self._waiting, *self._running.values()]:
                answer.error = answer.error or "the connection closed"
                answer._finish(answer.status or "failed")
            self._waiting.clear()
            self._running.clear()
            self._session_done.set()

    async def _resume(self) -> bool:
        """Reconnect after a drop: resume the session (or start a new one) and resend the frames
        the server did not take. Returns False when no connection could be opened."""
        self._connected.clear()
        for answer in [*self._waiting, *self._running.values()]:
            answer.error = "the connection dropped"
            answer._finish("interrupted")
        self._waiting.clear()
        self._running.clear()
        token = self.ready.resume_token
        for delay in RECONNECT_DELAYS_S:
            await asyncio.sleep(delay)
            try:
                conn, ready = await self._reopen({"resume_token": token} if token else {})
            except (OSError, TimeoutError, websockets.WebSocketException, StreamError):
                continue
            self.conn, self.ready = conn, ready
            self.resumes += 1
            frames = list(self._replay)
            ids = [frame.frame_id for frame in frames]
            taken = ready.last_frame_id if ready.resumed else None
            for frame in frames[ids.index(taken) + 1 :] if taken in ids else frames:
                await conn.send_event(frame)
            self._connected.set()
            return True
        return False

    def _on_event(self, event: AnyServerEvent) -> None:
        if isinstance(event, FrameAck):
            if event.accepted:
                self.frames.accepted += 1
            elif event.reason == "overloaded":
                self.frames.shed += 1
            else:
                self.frames.filtered += 1
        elif isinstance(event, ResponseStart):
            answer = self._waiting.popleft() if self._waiting else Answer("")
            answer.request_id = event.request_id
            self._running[answer.request_id] = answer
            if answer.listener:
                answer.listener.started(answer)
        elif isinstance(event, FramesConsumed):
            answer = self._running.get(event.request_id)
            if answer:
                answer.frame_ids = list(event.frame_ids)
                answer.frames_in_prompt = len(event.frames)
                answer.latest_pts_ms = event.latest_pts_ms
        elif isinstance(event, ResponseTextDelta):
            answer = self._running.get(event.request_id)
            if answer:
                if answer.ttft_ms is None:
                    answer.ttft_ms = round((time.perf_counter() - answer.sent_at) * 1000, 2)
                answer.text += event.delta
                if answer.listener:
                    answer.listener.text(answer, event.delta)
        elif isinstance(event, ResponseAudioDelta):
            answer = self._running.get(event.request_id)
            if answer:
                answer.audio_chunks += 1
        elif isinstance(event, ResponseDone):
            answer = self._running.pop(event.request_id, None)
            if answer:
                answer.finish_reason = event.finish_reason
                answer.server_timings = event.timings.model_dump()
                answer.usage = event.usage.model_dump()
                answer._finish(event.status)
        elif isinstance(event, ErrorEvent):
            self.errors.append(event.model_dump())
            if event.code in _REFUSALS and self._waiting:
                answer = self._waiting.popleft()
                answer.error = f"{event.code}: {event.message}"
                answer._finish("refused")
        elif isinstance(event, SessionDone):
            self._session_done.set()
