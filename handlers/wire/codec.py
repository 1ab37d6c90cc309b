"""Wire codecs: how one wire protocol maps onto the session core.

A ``Session`` speaks to its client only through a codec. ``decode`` turns one message into
the core's client events and commands (zero or more); ``encode`` turns one core server event
into wire messages (zero or more); ``opening`` gives the events to act on at connect, before
any message is read (a protocol whose sessions start without a config message opens with a
synthetic ``SessionConfig``). A codec translates only: frames, turns and answers are the
core's.

``V1Codec`` is protocol v1 (``protocol.py``) as it is. Every codec reads a message through
the same JSON front end (``strict_json.py``), so a message that is not strict JSON gets the
same error code on every endpoint. The OpenAI Realtime codec lives in
``handlers/realtime/``, the Gemini Live codec in ``handlers/live/``.
"""

from __future__ import annotations

from typing import Protocol

from handlers.wire.commands import Command
from handlers.wire.protocol import ClientEvent, ServerEvent, encode, parse_client_event

CoreInput = ClientEvent | Command


class WireCodec(Protocol):
    #: True when buffered audio becomes a question only by an explicit commit (not by a query).
    commits_audio: bool

    def opening(self) -> list[CoreInput]:
        """Events to act on at connect; empty: the first message must configure the session."""
        ...

    def decode(self, raw: str | bytes) -> list[CoreInput]:
        """One client message as core events. Raises ``SessionError`` for a bad message."""
        ...

    def encode(self, event: ServerEvent) -> list[str]:
        """One core server event as the messages to send (possibly none). Raises
        ``CloseConnection`` when the protocol answers the event by closing."""
        ...


class V1Codec:
    """Protocol v1: one message is one event, both ways."""

    #: v1 queries take the buffered microphone audio, so it is transcribed while it arrives.
    commits_audio = False

    def __init__(self, max_message_bytes: int | None = None) -> None:
        self._configured = False  # the first message is the config; later ones may not be
        self._max_bytes = max_message_bytes  # the server's max_message_bytes (None: the transport's only)

    def opening(self) -> list[CoreInput]:
        return []

    def decode(self, raw: str | bytes) -> list[CoreInput]:
        configured, self._configured = self._configured, True
        return [parse_client_event(raw, configured=configured, max_bytes=self._max_bytes)]

    def encode(self, event: ServerEvent) -> list[str]:
        if event.type.startswith("core."):
            return []  # a core event v1 has no message for (a held spoken turn's words)
        return [encode(event)]


class CloseConnection(Exception):
    """Raised by a codec's ``encode`` for an event its protocol can only answer by closing
    the connection (a protocol with no error event): the session closes with ``code`` and
    ``reason`` (at most 123 bytes of UTF-8)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
