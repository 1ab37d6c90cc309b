"""The one place that builds the uvicorn and WebSocket configuration.

``livesight serve``, the tests (``server/background.py``) and ``livesight bench`` all serve
through ``uvicorn_config``, so they run the same transport: the same message size limit,
keepalive pings, compression and the bounds on what is queued for a client.

uvicorn's WebSocket protocol answers a client's pings by writing pongs straight to the
socket, whether or not the client reads, and waits without a deadline for a client that
does not read to drain what was sent. ``BoundedWebSocketProtocol`` adds the two bounds:
a connection whose outgoing buffer passes ``max_send_buffer_bytes`` (a ping flood from a
peer that never reads), or that cannot take an event for ``send_timeout_s``, is closed with
code 1008 and dropped shortly after, whether or not the close frame could be delivered.

It also parses what a client sent in slices of ``PARSE_SLICE_BYTES``, one slice per turn of
the event loop: uvicorn hands each socket read (up to 256 KB) to the WebSocket parser at
once, and 256 KB of small messages (a client in a loop) is ~12,000 of them, parsed in one go
while every other session waited (~70 ms). Reading from that client pauses until its slices
are parsed, so what waits unparsed is bounded too. And a connection the app closes with
1008 (policy: a flood, a bad config) is not read any more: uvicorn would read on to the
client's close reply, parsing whatever the client had queued (a flooder's megabytes, a
second of the loop) for nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from server.settings import Settings

#: Close code for a client that does not read what it is sent, floods, or fails its config
#: (policy violation): after it, nothing more is read from the client.
SLOW_READER_CLOSE_CODE = 1008
#: After the close frame is queued, how long the socket may try to deliver it before it is cut.
CLOSE_GRACE_S = 5.0
#: Bytes of one client's input parsed per turn of the event loop (~1,500 tiny messages, a
#: few ms; a 640x480 JPEG frame takes 2-3 turns).
PARSE_SLICE_BYTES = 32 * 1024


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a bound on bytes queued for the client and on how
    long a send may wait for it. Subclassed per server by ``uvicorn_config`` with the limits."""

    max_send_buffer_bytes: int = 4 * 1024 * 1024
    send_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dropped = False
        self._unparsed = bytearray()  # read, not yet parsed (parsed a slice per loop turn) ...
        self._offset = 0  # ... from here: a slice is copied out, never the rest behind it

    def data_received(self, data: bytes) -> None:
        if self.dropped:
            return  # nothing more is read from (or answered to) a dropped client
        if self._unparsed:
            self._unparsed += data  # after what waits; reading was paused, this is its last read
            self.transport.pause_reading()
            return
        if len(data) <= PARSE_SLICE_BYTES:
            super().data_received(data)
            self._check_backlog()
            return
        self._unparsed, self._offset = bytearray(data), 0
        self.transport.pause_reading()
        self._parse_slice()

    def _parse_slice(self) -> None:
        """Parse the next slice of what waits now; the rest, if any, at the next loop turn."""
        start, end = self._offset, self._offset + PARSE_SLICE_BYTES
        data = bytes(self._unparsed[start:end])
        if end >= len(self._unparsed):
            self._unparsed, self._offset = bytearray(), 0
        else:
            self._offset = end
            self.loop.call_soon(self._parse_rest)
        super().data_received(data)
        self._check_backlog()

    def _parse_rest(self) -> None:
        if self.dropped or self.transport is None or self.transport.is_closing():
            self._unparsed, self._offset = bytearray(), 0
            return
        self._parse_slice()
        if not self._unparsed and not self.read_paused:
            self.transport.resume_reading()  # unless uvicorn's own queue wants it paused

    async def receive(self) -> Any:
        message = await super().receive()
        if self.dropped and self.transport.is_reading():
            self.transport.pause_reading()  # uvicorn resumes reading when its queue empties
        return message

    async def send(self, message: Any) -> None:
        if message["type"] == "websocket.close" and message.get("code") == SLOW_READER_CLOSE_CODE:
            await super().send(message)
            self.dropped = True  # what the client still sends is dropped unparsed (see the module docstring)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()
                # uvicorn would wait close_timeout (10 s) for the close reply it no longer reads,
                # and the client for the end of the connection (an SDK raises only then): end it
                # now, after what is queued (the close frame last). Plain TCP: a FIN (a close()
                # with unread input would reset the connection and lose the close frame); TLS,
                # which cannot half-close: close(), which sends close_notify after the queue.
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                else:
                    if self.close_timer is not None:
                        self.close_timer.cancel()
                    self.close_timer = self.loop.call_later(0, self.transport.close)
            return
        if message["type"] == "websocket.send":
            if self.dropped:
                raise ClientDisconnected()
            if not self.writable.is_set():
                try:
                    await asyncio.wait_for(self.writable.wait(), self.send_timeout_s)
                except TimeoutError:
                    self._drop("the client did not read for %.0f s" % self.send_timeout_s)
                    raise ClientDisconnected() from None
        await super().send(message)
        self._check_backlog()

    def _check_backlog(self) -> None:
        transport = self.transport
        if self.dropped or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() > self.max_send_buffer_bytes:
            self._drop("more than %d bytes queued for a client that does not read" % self.max_send_buffer_bytes)

    def _drop(self, why: str) -> None:
        """Close with 1008; cut the socket after a grace period if the client still does not read."""
        if self.dropped:
            return
        self.dropped = True
        self.logger.info("closing a WebSocket connection: %s", why)
        self.stop_keepalive()
        if not self.close_sent:
            self.conn.fail(SLOW_READER_CLOSE_CODE, "client does not read")
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            self.queue.put_nowait({"type": "websocket.disconnect", "code": SLOW_READER_CLOSE_CODE})
        self.writable.set()  # a send waiting for the client now fails at once
        # Stop reading the peer and send FIN once what is queued (the close frame last) is
        # delivered, if the client ever reads it; a plain close() now would reset the
        # connection (unread pings) and discard the close frame. Cut it after a grace period
        # either way (uvicorn's end-of-app close waits for this timer).
        self.transport.pause_reading()
        self.read_paused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.close_timer is not None:
            self.close_timer.cancel()
        self.close_timer = self.loop.call_later(CLOSE_GRACE_S, self.transport.abort)


def uvicorn_config(
    app: Any, settings: Settings, *, port: int | None = None, log_level: str | None = None, **extra: Any
) -> uvicorn.Config:
    """The uvicorn configuration for ``app`` under ``settings`` (``port`` overrides the setting;
    ``extra`` goes to ``uvicorn.Config`` as it is)."""
    protocol = type(
        "LivesightWebSocketProtocol",
        (BoundedWebSocketProtocol,),
        {"max_send_buffer_bytes": settings.max_send_buffer_bytes, "send_timeout_s": settings.send_timeout_s},
    )
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port if port is None else port,
        log_level=(log_level or settings.log_level).lower(),
        lifespan="on",
        ws=protocol,
        ws_max_size=settings.max_message_bytes,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
        ws_per_message_deflate=settings.ws_compression,
        **_tls(settings),
        **extra,
    )


def _tls(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS options from the settings (none without ``ssl_certfile``)."""
    if settings.ssl_certfile is None:
        return {}
    password = settings.ssl_keyfile_password
    return {
        "ssl_certfile": str(settings.ssl_certfile),
        "ssl_keyfile": str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        "ssl_keyfile_password": password.get_secret_value() if password else None,
    }
