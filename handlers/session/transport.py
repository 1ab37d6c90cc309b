"""The session's view of its socket: receive text, send text, close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from handlers.wire.codec import WireCodec


class Disconnected(Exception):
    """The client went away; ``code`` is its close code when it sent one (1000: it is done)."""

    def __init__(self, code: int | None = None) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True, slots=True)
class Decoded:
    """Client inputs a transport decoded itself (a WebRTC call's camera frames and
    microphone audio), read in order with its messages and not through the codec."""

    events: list[object]


class Transport(Protocol):
    async def receive(self) -> str | bytes | Decoded:
        """Next message. Raises ``Disconnected``."""
        ...

    async def send(self, text: str) -> None:
        """Send one text message. Raises ``Disconnected``."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the connection with ``code`` and ``reason`` (idempotent)."""
        ...


class Prefaced:
    """A transport whose first messages are given (the session config an ephemeral key
    carries), read before the client's."""

    def __init__(self, inner: Transport, *first: str) -> None:
        self.inner = inner
        self._first = list(first)

    async def receive(self) -> str | bytes | Decoded:
        if self._first:
            return self._first.pop(0)
        return await self.inner.receive()

    async def send(self, text: str) -> None:
        await self.inner.send(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.inner.close(code, reason)


#: Runs one session over a transport to its end, speaking a codec, for an owner (a key's
#: digest): what the server hands a WebRTC call or a stream.
ServeSession = Callable[[Transport, "WireCodec", str], Awaitable[None]]
