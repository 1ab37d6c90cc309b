"""The engine jobs the core hands out with the frames they hold: a prefill (``WarmStep``) and
a round of watch checks (``CheckStep``). Their frames stay pinned until the job is reported
ended."""

from __future__ import annotations

from dataclasses import dataclass

from handlers.core.frames import Frame
from handlers.core.memory import SearchRun
from server.engines.base import Prompt


@dataclass(frozen=True, slots=True)
class CheckStep:
    """One round of watch checks the executor runs for the core: one prompt per watch (the
    timeline as warmed, plus the watch's question), over ``frames`` (pinned until
    ``SessionCore.checked``); ``frame`` is the newest, the one the round decides about. A
    memory search's round (``search``) asks its condition of each of its moments' keyframes."""

    frames: list[Frame]
    prompts: list[tuple[str, Prompt]]
    frame: Frame | None
    search: SearchRun | None = None  # a memory search's round: one prompt per remembered moment


@dataclass(frozen=True, slots=True)
class CaptionStep:
    """A moment's caption the executor has the engine write on the warm prefix: ``prompt``
    (the timeline and the caption's question) over ``frames`` (pinned until
    ``SessionCore.captioned``), at most ``tokens``; ``at_ms``: the moment's start."""

    frames: list[Frame]
    prompt: Prompt
    at_ms: float
    tokens: int


@dataclass(frozen=True, slots=True)
class WarmStep:
    """One prefill the executor runs for the core: ``prompt`` over ``frames``, which stay
    pinned until ``SessionCore.warmed`` is called with this step. ``slide``: a prefill of the
    next window (``window_slide``), not of the prompt the session asks on now."""

    frames: list[Frame]
    prompt: Prompt
    slide: bool = False
