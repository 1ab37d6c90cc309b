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

Pure and synchronous, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Sequence
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
class TimelineTurn:
    """One live exchange: the frames shown since the previous turn, the question, the answer."""

    frames: list[Frame]
    question: str
    answer: str


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
    _last_seen: int = -1  # seq of the newest frame considered for admission

    @property
    def frames(self) -> list[Frame]:
        """Every frame in the timeline, oldest first."""
        return [f for turn in self.turns for f in turn.frames] + self.open

    # ------------------------------------------------------------------ frames
    def forget_evicted(self) -> bool:
        """Drop frames that left the buffer window and fold leading turns left without
        frames into the text history. Returns True when anything changed."""
        changed = False
        for turn in self.turns:
            kept = [f for f in turn.frames if f.in_window]
            changed |= len(kept) != len(turn.frames)
            turn.frames = kept
        kept = [f for f in self.open if f.in_window]
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
        self.turns.append(TimelineTurn(self.open, question, answer))
        self.open = []

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
