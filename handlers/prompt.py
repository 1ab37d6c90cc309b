"""Building prompts: system prompt, recent history as text, then the user turn.

The user turn is the frames (each optionally preceded by its time in seconds since the
session's first frame), then audio, then the question. A warm prefix is the same user turn
without audio and question, left open, so the prefix is always a true prefix of the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from handlers.frames import Frame
from server.engines.base import (
    AudioSegment,
    ChatTurn,
    ImageSegment,
    Prompt,
    Segment,
    TextSegment,
)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant watching a live video stream. The frames are shown in "
    "order with their time in seconds. Answer about what the camera shows, briefly."
)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One finished question and answer, kept as text for later prompts."""

    question: str
    answer: str


def frame_time_s(frame: Frame, origin: Frame) -> float:
    """Seconds since the session's first frame: from client pts when both have one."""
    if frame.pts_ms is not None and origin.pts_ms is not None:
        return max(0.0, (frame.pts_ms - origin.pts_ms) / 1000.0)
    return max(0.0, (frame.receive_ts_ms - origin.receive_ts_ms) / 1000.0)


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
    """Return the prompt; without ``question`` it is an open warm prefix.

    Frames must be decoded (``frame.image`` set).
    """
    turns = [ChatTurn("system", (TextSegment(system_prompt or DEFAULT_SYSTEM_PROMPT),))]
    for past in history:
        turns.append(ChatTurn("user", (TextSegment(past.question),)))
        turns.append(ChatTurn("assistant", (TextSegment(past.answer),)))
    segments: list[Segment] = []
    for frame in frames:
        if frame.image is None:
            raise ValueError(f"frame {frame.seq} is not decoded")
        if timestamps and origin is not None:
            segments.append(TextSegment(f"[{frame_time_s(frame, origin):.1f}s]"))
        segments.append(ImageSegment(frame.key, frame.image, frame.data))
    if question is None:
        return Prompt(tuple(turns) + (ChatTurn("user", tuple(segments)),), open_turn=True)
    if audio is not None:
        segments.append(audio)
    segments.append(TextSegment("\n" + question if segments else question))
    return Prompt(tuple(turns) + (ChatTurn("user", tuple(segments)),))
