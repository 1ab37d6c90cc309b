"""Wire codecs: how one wire protocol maps onto the session core.

A ``Session`` speaks to its client only through a codec. ``decode`` turns one message into
the core's client events and commands (zero or more); ``encode`` turns one of the core's
events (``handlers/core/events.py``) into wire messages (zero or more); ``opening`` gives the
events to act on at connect, before any message is read (a protocol whose sessions start
without a config message opens with a synthetic ``SessionConfig``). A codec translates only:
frames, turns and answers are the core's.

``V1Codec`` is protocol v1 (``protocol.py``) as it is: a table from each core event to the
v1 model that carries it, built from the event's fields. Every codec reads a message through
the same JSON front end (``strict_json.py``), so a message that is not strict JSON gets the
same error code on every endpoint. The OpenAI Realtime codec lives in
``handlers/realtime/``, the Gemini Live codec in ``handlers/live/``.
"""

from __future__ import annotations

from typing import Protocol

from handlers.core import events as ev
from handlers.wire import server_events as v1
from handlers.wire.commands import Command
from handlers.wire.protocol import ClientEvent, parse_client_event

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

    def encode(self, event: ev.Event) -> list[str]:
        """One core event as the messages to send (possibly none). Raises
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

    def encode(self, event: ev.Event) -> list[str]:
        model = V1_MESSAGES.get(type(event))
        if model is None:
            return []  # an event v1 has no message for (a held spoken turn's words, an item's edit)
        # The v1 model reads the event's fields (nested values too) and leaves out the ones
        # v1 does not carry (the conversation's items, an error's origin).
        return [v1.encode(model.model_validate(event, from_attributes=True))]


#: Each core event v1 has a message for, and the v1 model of that message.
V1_MESSAGES: dict[type[ev.Event], type[v1.ServerEvent]] = {
    ev.SessionReady: v1.SessionReady,
    ev.FrameAcked: v1.FrameAck,
    ev.FramesConsumed: v1.FramesConsumed,
    ev.AnswerStarted: v1.ResponseStart,
    ev.AnswerTextDelta: v1.ResponseTextDelta,
    ev.AnswerTextDone: v1.ResponseTextDone,
    ev.AnswerAudioDelta: v1.ResponseAudioDelta,
    ev.AnswerAudioDone: v1.ResponseAudioDone,
    ev.AnswerEnded: v1.ResponseDone,
    ev.SpeechBegan: v1.InputAudioSpeechStarted,
    ev.SpeechEnded: v1.InputAudioSpeechStopped,
    ev.QuestionTranscribed: v1.InputAudioTranscript,
    ev.SessionDone: v1.SessionDone,
    ev.SessionClosing: v1.SessionClosing,
    ev.ErrorReported: v1.ErrorEvent,
    ev.Pong: v1.Pong,
    ev.WatchCreated: v1.WatchCreated,
    ev.WatchUpdated: v1.WatchUpdated,
    ev.WatchDeleted: v1.WatchDeleted,
    ev.WatchChecked: v1.WatchCheck,
    ev.WatchFired: v1.WatchFired,
    ev.WatchCleared: v1.WatchCleared,
    ev.MemoryProgress: v1.MemoryProgress,
    ev.MemoryResults: v1.MemoryResults,
    ev.MemoryCleared: v1.MemoryCleared,
}


class CloseConnection(Exception):
    """Raised by a codec's ``encode`` for an event its protocol can only answer by closing
    the connection (a protocol with no error event): the session closes with ``code`` and
    ``reason`` (at most 123 bytes of UTF-8)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason
