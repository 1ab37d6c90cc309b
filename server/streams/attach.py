"""A v1 client attached to a stream (``/v1/video/chat/stream?stream_id=...``): it hears the
stream's session as it goes (the ``session.ready`` it started with first, then every event:
checks, fires, answers, acks of the camera's frames), asks questions about what the camera
sees, and manages its watches; its own frames and audio are refused (the camera is the
session's only source). Several clients may attach to one stream; each hears every event.
A client that falls ``max_pending`` events behind is closed (1008), and every client when the
stream is deleted (1000); leaving changes nothing.
"""

from __future__ import annotations

import json
import logging

import anyio

from handlers.core.events import ErrorReported
from handlers.session.transport import Disconnected, Transport
from handlers.wire.codec import V1Codec
from handlers.wire.errors import ErrorCode
from server.streams.stream import Stream

log = logging.getLogger("livesight.streams")

#: What an attached client may not send: the camera is the stream's only source.
REFUSED = frozenset({"video.frame", "audio.chunk", "session.config", "video.done"})


def _error(code: ErrorCode, message: str) -> str:
    return V1Codec().encode(ErrorReported(code=code.value, message=message))[0]


async def attach(stream: Stream, transport: Transport, max_pending: int) -> None:
    """Serve an attached client until it leaves or the stream ends."""
    send, events = anyio.create_memory_object_stream[str](max_pending)
    behind = anyio.Event()

    def hear(text: str) -> None:
        try:
            send.send_nowait(text)
        except anyio.WouldBlock:
            behind.set()

    if stream.ready_text is not None:
        send.send_nowait(stream.ready_text)
    stream.transport.listeners.add(hear)
    try:
        async with anyio.create_task_group() as tg:
            async def forward() -> None:
                async for text in events:
                    await transport.send(text)

            async def overrun() -> None:
                await behind.wait()
                log.info("stream %s: an attached client fell behind; closed", stream.stream_id)
                await transport.close(1008, "too far behind")
                tg.cancel_scope.cancel()

            async def over() -> None:
                await stream.ended.wait()
                await transport.close(1000, "the stream ended")
                tg.cancel_scope.cancel()

            tg.start_soon(forward)
            tg.start_soon(overrun)
            tg.start_soon(over)
            try:
                while True:
                    raw = await transport.receive()
                    await _take(stream, transport, raw)
            except Disconnected:
                pass
            tg.cancel_scope.cancel()
    finally:
        stream.transport.listeners.discard(hear)
        send.close()


async def _take(stream: Stream, transport: Transport, raw: str | bytes) -> None:
    """One message of the client: a control message goes to the stream's session; a frame,
    audio or a config is refused, and a message that is not a JSON object too."""
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        await transport.send(_error(ErrorCode.INVALID_JSON, "a message is a JSON object"))
        return
    kind = message.get("type") if isinstance(message, dict) else None
    if not isinstance(kind, str):
        await transport.send(_error(ErrorCode.INVALID_MESSAGE, "a message is a JSON object with a string type"))
    elif kind in REFUSED:
        await transport.send(_error(ErrorCode.INVALID_MESSAGE,
                                    f"{kind} is refused here: this connection watches a stream, whose camera is its source"))
    else:
        stream.transport.control(message)
