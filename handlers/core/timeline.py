"""The session's timeline: what the model has been shown and told, in the order it happened.

Every prompt of a session is rendered from it (``prompt.render_timeline``): the system
prompt, older questions and answers kept as text, then the live turns, each a user turn
holding the frames that arrived since the previous turn and then the question, and an
assistant turn holding the answer as generated. Frames that arrived since the last question
form the open user turn, which the warm prefix covers and the next question closes.

The timeline only grows at its end, so each prompt extends the previous one and an engine's
prefix cache (the transformers engine's KV cache, vLLM's block cache) already holds all but
the newest part: a follow-up question pays for its own words. It changes in front only when
frames leave it, in bulk:

- **eviction**: frames that left the buffer window leave the timeline; leading turns with
  no frame left fold into the text history (``max_history_turns``, ``max_history_tokens``);
- **thinning**: no prompt holds more than ``num_frames`` frames. Frames are admitted at a
  stride (every frame at first); when one more would go over the bound, every other frame
  of the timeline is dropped and the stride doubles, so the frames keep spanning the whole
  buffered time at half the density. A question always sees the newest frame it waited for.

Conversation items edit it in place: a message (user or assistant) can be put after any
message or at the start, taken out, or an answer cut to what its listener heard. Such an
edit changes the prompt from that point on (the engine recomputes from there); the timeline
says so in ``edited``, for the warm prefix.

Pure and synchronous, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from handlers.core.frames import Frame

INTERRUPTED_MARK = "[interrupted]"
CHARS_PER_TOKEN = 4  # estimate for the text history bound: the core has no tokenizer


@dataclass(frozen=True, slots=True)
class Exchange:
    """One finished question and answer, kept as text after its frames have left."""

    question: str
    answer: str


@dataclass
class Message:
    """One message of a turn: a user's words or an assistant's. ``item_ids``: the
    conversation items it holds (a question made of several inputs holds each); ``spoken``:
    an answer's audio as (ms from its start where each spoken piece ends, the words spoken)."""

    role: str  # "user" or "assistant"
    text: str
    item_ids: tuple[str, ...] = ()
    spoken: tuple[tuple[float, str], ...] = ()

    @property
    def audio_ms(self) -> float | None:
        """How long the answer's audio is (None: it was not spoken)."""
        return self.spoken[-1][0] if self.spoken else None


@dataclass
class TimelineTurn:
    """One live exchange: the frames shown since the previous turn, then its messages (the
    question, then the answer, or what the client put there)."""

    frames: list[Frame]
    messages: list[Message]

    @classmethod
    def of(cls, frames: list[Frame], question: str, answer: str) -> TimelineTurn:
        """A turn of one question and its answer."""
        return cls(frames, [Message("user", question), Message("assistant", answer)])

    @property
    def question(self) -> str:
        """The user's words before the first answer."""
        texts = []
        for message in self.messages:
            if message.role != "user":
                break
            texts.append(message.text)
        return "\n".join(t for t in texts if t)

    @property
    def answer(self) -> str:
        """The assistant's words."""
        return "\n".join(m.text for m in self.messages if m.role == "assistant" and m.text)


def heard_text(message: Message, audio_end_ms: float) -> str:
    """The words of a spoken answer that its first ``audio_end_ms`` carry: every piece that
    ended by then, and of the piece under way the share of its words its time covers (audio
    with no words of its own, an engine's voice: that share of the whole text)."""
    if not message.spoken or audio_end_ms >= message.spoken[-1][0]:
        return message.text
    if not any(words for _, words in message.spoken):
        words = message.text.split()
        return " ".join(words[: int(len(words) * audio_end_ms / message.spoken[-1][0])])
    heard: list[str] = []
    start = 0.0
    for end, words in message.spoken:
        if end <= audio_end_ms:
            heard += words.split()
        else:
            part = words.split()
            heard += part[: int(len(part) * max(0.0, audio_end_ms - start) / max(end - start, 1e-6))]
            break
        start = end
    return " ".join(heard)


def interrupted_answer(text: str) -> str:
    """How an interrupted answer stays in the timeline: its text so far, then the mark."""
    return f"{text} {INTERRUPTED_MARK}" if text else INTERRUPTED_MARK


def estimated_tokens(text: str) -> int:
    """A tokenizer-free estimate of a text's length in tokens."""
    return len(text) // CHARS_PER_TOKEN + 1


@dataclass
class Timeline:
    """The session's conversation and frames; see the module docstring."""

    num_frames: int
    max_history_turns: int = 4
    max_history_tokens: int = 1024
    history: list[Exchange] = field(default_factory=list)
    turns: list[TimelineTurn] = field(default_factory=list)
    open: list[Frame] = field(default_factory=list)
    stride: int = 1
    edited: bool = False  # a message was put in, taken out or cut since the last warm-up
    _last_seen: int = -1  # seq of the newest frame considered for admission

    @property
    def frames(self) -> list[Frame]:
        """Every frame in the timeline, oldest first."""
        return [f for turn in self.turns for f in turn.frames] + self.open

    # ------------------------------------------------------------------ frames
    def forget_evicted(self) -> bool:
        """Drop frames that left the buffer window and fold leading turns left without
        frames into the text history. Returns True when anything changed."""
        return self._forget(lambda f: f.in_window)

    def from_frame(self, first: Frame) -> Timeline:
        """A copy of this timeline as it will be once the frames before ``first`` have left
        (a window slide's next window); this one is not changed."""
        copy = Timeline(
            self.num_frames, self.max_history_turns, self.max_history_tokens, list(self.history),
            [TimelineTurn(list(t.frames), list(t.messages)) for t in self.turns], list(self.open), self.stride,
            self.edited, self._last_seen,
        )
        copy._forget(lambda f: f.in_window and f.seq >= first.seq)
        return copy

    def _forget(self, keep: Callable[[Frame], bool]) -> bool:
        changed = False
        for turn in self.turns:
            kept = [f for f in turn.frames if keep(f)]
            changed |= len(kept) != len(turn.frames)
            turn.frames = kept
        kept = [f for f in self.open if keep(f)]
        changed |= len(kept) != len(self.open)
        self.open = kept
        return self._fold() or changed

    def admit(self, candidates: Sequence[Frame], *, newest: Frame | None = None) -> None:
        """Take in the decoded candidates newer than any considered before, in order (stopping
        at the first still decoding: a prefix cannot skip a frame).

        A frame is admitted when it is at least ``stride`` frames after the newest one held,
        thinning first to stay within ``num_frames``. ``newest`` (a question's newest frame)
        is admitted whatever the stride, still within ``num_frames``: when the timeline is
        full it replaces the last frame of the open turn (only that frame is sent anew), or,
        when the open turn has none, the timeline is thinned.
        """
        for frame in candidates:
            if frame.seq <= self._last_seen or frame is newest or not frame.in_window:
                continue
            if frame.image is None:
                break  # still decoding
            self._last_seen = frame.seq
            self._maybe_add(frame, cap=self.num_frames)
        if newest is not None and newest.image is not None and newest.in_window and newest not in self.frames:
            self._last_seen = max(self._last_seen, newest.seq)
            if len(self.frames) >= self.num_frames and self.open:
                self.open.pop()  # the newest frame takes the place of the last open one: one frame re-sent
            else:
                self._make_room(self.num_frames)
            self.open.append(newest)

    def _maybe_add(self, frame: Frame, cap: int) -> None:
        held = self.frames
        if held and frame.seq - held[-1].seq < self.stride:
            return
        if len(held) >= cap:
            self._make_room(cap)
            held = self.frames
            if held and frame.seq - held[-1].seq < self.stride:
                return
        self.open.append(frame)

    def _make_room(self, cap: int) -> None:
        """Drop frames until one more fits under ``cap``: every other one (stride doubles),
        or all of them when the cap is one frame (the newest alone is shown)."""
        while len(self.frames) >= cap:
            frames = self.frames
            if cap <= 1 or len(frames) < 2:
                keep: set[int] = set()
            else:
                keep = {id(f) for f in frames[::2]}
                self.stride *= 2
            for turn in self.turns:
                turn.frames = [f for f in turn.frames if id(f) in keep]
            self.open = [f for f in self.open if id(f) in keep]
        self._fold()

    # ------------------------------------------------------------------ turns
    def close_turn(self, question: str, answer: str) -> None:
        """An answer ended: the open frames, the question and the answer become a turn."""
        self.close_with([Message("user", question), Message("assistant", answer)])

    def close_with(self, messages: list[Message]) -> None:
        """The open frames and ``messages`` become a turn (an answer ended, or the client
        put an assistant message at the end)."""
        self.turns.append(TimelineTurn(self.open, [m for m in messages if m.text or m.role == "assistant"]))
        self.open = []

    # ------------------------------------------------------------------ items
    def find(self, item_id: str) -> tuple[TimelineTurn, int] | None:
        """The turn holding message ``item_id`` and its index there, or None."""
        for turn in self.turns:
            for n, message in enumerate(turn.messages):
                if item_id in message.item_ids:
                    return turn, n
        return None

    def holds_frame(self, item_id: str) -> TimelineTurn | None:
        """The closed turn that shows frame ``item_id``, or None."""
        return next((t for t in self.turns if any(str(f.frame_id) == item_id for f in t.frames)), None)

    def insert(self, after: str | None, message: Message) -> bool:
        """Put ``message`` after the message or frame ``after`` of a closed turn (None: before
        everything). Returns False when no closed turn holds ``after``."""
        if after is None:
            if self.turns:
                self.turns[0].messages.insert(0, message)
            else:
                self.turns.append(TimelineTurn([], [message]))
            self.edited = True
            return True
        found = self.find(after)
        if found is not None:
            found[0].messages.insert(found[1] + 1, message)
        elif (turn := self.holds_frame(after)) is not None:
            turn.messages.insert(0, message)
        else:
            return False
        self.edited = True
        return True

    def remove(self, item_id: str) -> bool:
        """Take message ``item_id`` out (a turn left with nothing goes). False: not here."""
        found = self.find(item_id)
        if found is None:
            return False
        turn, n = found
        del turn.messages[n]
        if not turn.messages and not turn.frames:
            self.turns.remove(turn)
        self.edited = True
        return True

    def replace(self, item_id: str, message: Message) -> None:
        """Message ``item_id`` becomes ``message`` (an answer cut to what was heard)."""
        found = self.find(item_id)
        if found is not None:
            found[0].messages[found[1]] = message
            self.edited = True

    def _fold(self) -> bool:
        folded = False
        while self.turns and not self.turns[0].frames:
            turn = self.turns.pop(0)
            self.history.append(Exchange(turn.question, turn.answer))
            folded = True
        if folded:
            self._bound_history()
        return folded

    def _bound_history(self) -> None:
        del self.history[: max(0, len(self.history) - self.max_history_turns)]
        while self.history and sum(
            estimated_tokens(e.question) + estimated_tokens(e.answer) for e in self.history
        ) > self.max_history_tokens:
            del self.history[0]
