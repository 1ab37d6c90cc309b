"""The answer being sent, as a codec follows it from its ``response.start`` to its
``response.done``.

A codec that does not send v1's events one for one still needs a little of the running
answer to say the next event in its own words: whether it speaks, its text so far, and for
Realtime the ids and metadata it announced. The core owns the answer; this is the codec's
view of it, kept in one place for every codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from handlers.core.events import AnswerStarted



@dataclass(slots=True)
class RunningAnswer:
    """One answer as it was announced: ``request_id``; ``item_id``, the conversation item it
    becomes; ``speaks``, audio among its modalities; the client's ``metadata`` (a watch's
    answer: which watch); ``in_conversation`` false for an out-of-band answer; and ``text``,
    its words so far."""

    request_id: str
    item_id: str
    speaks: bool
    metadata: dict[str, str] | None = None
    in_conversation: bool = True
    text: str = ""


class AnswerTracker:
    """The session's running answer (None between answers) and the last one's id."""

    def __init__(self) -> None:
        self.running: RunningAnswer | None = None
        self.last_request_id: str | None = None

    def start(self, event: AnswerStarted, item_id: str, metadata: dict[str, str] | None = None) -> RunningAnswer:
        """The answer ``event`` starts, now the running one; ``item_id`` and ``metadata`` as
        the codec announces them."""
        answer = RunningAnswer(event.request_id, item_id, "audio" in event.modalities, metadata, event.in_conversation)
        self.running, self.last_request_id = answer, event.request_id
        return answer

    def finish(self) -> RunningAnswer | None:
        """The answer that ended (None: none ran); no answer runs after it."""
        answer, self.running = self.running, None
        return answer

    @property
    def speaking(self) -> bool:
        """True while an answer that speaks runs."""
        return self.running is not None and self.running.speaks
