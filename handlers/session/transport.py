"""The session's view of its socket: receive text, send text, close."""

from __future__ import annotations

from typing import Protocol


class Disconnected(Exception):
    """The client went away; ``code`` is its close code when it sent one (1000: it is done)."""

    def __init__(self, code: int | None = None) -> None:
        super().__init__(code)
        self.code = code


class Transport(Protocol):
    async def receive(self) -> str | bytes:
        """Next message. Raises ``Disconnected``."""
        ...

    async def send(self, text: str) -> None:
        """Send one text message. Raises ``Disconnected``."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the connection with ``code`` and ``reason`` (idempotent)."""
        ...
