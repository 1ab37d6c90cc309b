"""What a session reports for monitoring, through a small typed interface.

The session calls an observer at a few points of its life; the server implements it
(``server/metrics.py`` turns the calls into Prometheus metrics). The session core knows
nothing of how the numbers are kept. Every method does nothing by default, so a session
without an observer, or a test, pays nothing.
"""

from __future__ import annotations

from typing import Literal

from handlers.core.events import Event
from handlers.wire.protocol import ClientEvent

#: What became of an incoming frame: buffered, dropped as a near-duplicate, pushed out of the
#: buffer by newer frames, dropped under load before any work, or refused (bad or too large).
FrameOutcome = Literal["accepted", "filtered", "evicted", "shed", "invalid"]


class SessionObserver:
    """Callbacks from one session. Implementations must be cheap and must not raise."""

    def opened(self) -> None:
        """The connection became a session (before its ``session.config``)."""

    def closed(self) -> None:
        """The session ended; no call follows."""

    def received(self, event: ClientEvent) -> None:
        """A client message was parsed (bad messages are reported as the ``error`` they get)."""

    def sent(self, event: Event) -> None:
        """An event was sent to the client."""

    def frames(self, outcome: FrameOutcome, count: int = 1) -> None:
        """``count`` frames had ``outcome``."""

    def refused(self) -> None:
        """A control message was refused: the session was over its control budget."""

    def checks(self, ran: int, skipped: int) -> None:
        """A round of watch checks ended: ``ran`` checks ran to the end, and ``skipped``
        accepted frames since the round before got no check (the model was busy, or too soon)."""

    def captions(self, written: int, skipped: int) -> None:
        """Moments' captions: ``written`` by the engine, ``skipped`` (a newer moment came first,
        or the engine wrote nothing)."""

    def caption_work(self, computed: int, generated: int, seconds: float) -> None:
        """A caption's engine work: prompt tokens ``computed`` past the warm prefix, tokens
        ``generated``, and ``seconds`` from its request to its last token."""


class Observers(SessionObserver):
    """Several observers as one, called in order."""

    def __init__(self, *observers: SessionObserver) -> None:
        self.observers = observers

    def opened(self) -> None:
        for o in self.observers:
            o.opened()

    def closed(self) -> None:
        for o in self.observers:
            o.closed()

    def received(self, event: ClientEvent) -> None:
        for o in self.observers:
            o.received(event)

    def sent(self, event: Event) -> None:
        for o in self.observers:
            o.sent(event)

    def frames(self, outcome: FrameOutcome, count: int = 1) -> None:
        for o in self.observers:
            o.frames(outcome, count)

    def refused(self) -> None:
        for observer in self.observers:
            observer.refused()

    def checks(self, ran: int, skipped: int) -> None:
        for observer in self.observers:
            observer.checks(ran, skipped)

    def captions(self, written: int, skipped: int) -> None:
        for observer in self.observers:
            observer.captions(written, skipped)

    def caption_work(self, computed: int, generated: int, seconds: float) -> None:
        for observer in self.observers:
            observer.caption_work(computed, generated, seconds)
