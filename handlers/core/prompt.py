"""Rendering the session's timeline (``timeline.py``) as a prompt.

One renderer builds every prompt of a session: system prompt, older questions and answers as
text, the live turns (a user turn with the frames that arrived since the previous turn, each
optionally preceded by its time in seconds since the session's first frame, then the
question; an assistant turn with the answer), then the open user turn: the frames since the
last question and, for a query, its audio and question. Without a question the open turn is
left open: that is the warm prefix, always a true prefix of the next query.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from handlers.core.frames import Frame
from handlers.core.timeline import Exchange, TimelineTurn
from server.engines.base import (
    AudioSegment,
    ChatTurn,
    ImageSegment,
    Prompt,
    Segment,
    TextSegment,
)

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Exchange", "build_prompt", "frame_time_s", "render_timeline"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant watching a live video stream. The frames are shown in "
    "order with their time in seconds. Answer about what the camera shows, briefly."
)


def frame_time_s(frame: Frame, origin: Frame) -> float:
    """Seconds since the session's first frame: from client pts when both have one."""
    if frame.pts_ms is not None and origin.pts_ms is not None:
        return max(0.0, (frame.pts_ms - origin.pts_ms) / 1000.0)
    return max(0.0, (frame.receive_ts_ms - origin.receive_ts_ms) / 1000.0)


def _frame_segments(frames: Sequence[Frame], origin: Frame | None, timestamps: bool) -> list[Segment]:
    segments: list[Segment] = []
    for frame in frames:
        if frame.image is None:
            raise ValueError(f"frame {frame.seq} is not decoded")
        if timestamps and origin is not None:
            segments.append(TextSegment(f"[{frame_time_s(frame, origin):.1f}s]"))
        segments.append(ImageSegment(frame.key, frame.image, frame.data))
    return segments


def _user_turn(segments: list[Segment], audio: AudioSegment | None, question: str) -> ChatTurn:
    segments = list(segments)
    if audio is not None:
        segments.append(audio)
    segments.append(TextSegment("\n" + question if segments else question))
    return ChatTurn("user", tuple(segments))


def _turn_messages(turn: TimelineTurn, frames: list[Segment]) -> list[ChatTurn]:
    """A closed turn as chat turns: a user turn with its frames and the words before the first
    answer, then each run of messages of one role as one turn (an empty user message is left out)."""
    messages = turn.messages
    first = next((n for n, m in enumerate(messages) if m.role != "user"), len(messages))
    question = "\n".join(m.text for m in messages[:first] if m.text)
    out = []
    if question:
        out.append(_user_turn(frames, None, question))
    elif frames:
        out.append(ChatTurn("user", tuple(frames)))
    for role, run in groupby((m for m in messages[first:] if m.text or m.role != "user"), key=lambda m: m.role):
        text = "\n".join(m.text for m in run)
        if out and out[-1].role == role and role == "user":
            out[-1] = ChatTurn("user", (*out[-1].segments, TextSegment("\n" + text)))
        else:
            out.append(ChatTurn(role, (TextSegment(text),)))
    return out


def render_timeline(
    *,
    system_prompt: str | None,
    history: Sequence[Exchange],
    turns: Sequence[TimelineTurn],
    open_frames: Sequence[Frame],
    origin: Frame | None,
    timestamps: bool,
    audio: AudioSegment | None = None,
    question: str | None = None,
    earlier: str | None = None,
) -> Prompt:
    """Return the prompt; without ``question`` it is an open warm prefix. ``earlier`` (what left
    the window, as text) opens the first user turn after the text history: before every frame,
    so a prefix that moves (``kv_shift``) computes it again only when it changes.

    Frames must be decoded (``frame.image`` set); raises ``ValueError`` otherwise.
    """
    head = [ChatTurn("system", (TextSegment(system_prompt or DEFAULT_SYSTEM_PROMPT),))]
    for past in history:
        head.append(ChatTurn("user", (TextSegment(past.question),)))
        head.append(ChatTurn("assistant", (TextSegment(past.answer),)))
    out: list[ChatTurn] = []
    for turn in turns:
        out += _turn_messages(turn, _frame_segments(turn.frames, origin, timestamps))
    segments = _frame_segments(open_frames, origin, timestamps)
    out.append(ChatTurn("user", tuple(segments)) if question is None else _user_turn(segments, audio, question))
    if earlier:
        out = _opened_with(out, earlier)
    return Prompt(tuple(head + out), open_turn=question is None)


def _opened_with(turns: list[ChatTurn], text: str) -> list[ChatTurn]:
    """``turns`` with ``text`` at the start of the first (a user turn of its own if that one
    is not the user's)."""
    first = turns[0]
    if first.role != "user":
        return [ChatTurn("user", (TextSegment(text),)), *turns]
    return [ChatTurn("user", (TextSegment(text + "\n"), *first.segments)), *turns[1:]]


def build_prompt(
    *,
    system_prompt: str | None,
    history: Sequence[Exchange],
    frames: Sequence[Frame],
    origin: Frame | None,
    timestamps: bool,
    audio: AudioSegment | None = None,
    question: str | None = None,
) -> Prompt:
    """A timeline with text history and one open turn of ``frames``: the first question's prompt."""
    return render_timeline(
        system_prompt=system_prompt, history=history, turns=(), open_frames=frames, origin=origin,
        timestamps=timestamps, audio=audio, question=question,
    )
