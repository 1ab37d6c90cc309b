"""Session configuration: what a client asks for, negotiated against what this server serves.

``opening_config`` takes a session's first message as its ``session.config``; ``negotiate``
turns a requested config into the one the session runs with (what the engine and the voice
stages can do, the server's limits), with a note for each change; ``merge_changes`` applies a
running session's ``session.update`` part by part, refusing only the parts that are not
valid. ``Limits`` and ``VoicePaths`` are what the server tells the core about itself. Pure,
like the rest of the core; the core (``SessionCore.configure`` / ``update``) applies the result
to its buffer, filter and microphone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import SessionConfig, describe_validation_error
from server.engines.base import Capabilities


@dataclass(frozen=True, slots=True)
class Limits:
    """The per-session limits a client is told about in ``session.ready``."""

    max_frame_bytes: int
    max_audio_bytes: int
    max_queue: int
    idle_timeout_s: float
    max_history_turns: int
    max_answer_tokens: int
    max_history_tokens: int = 1024
    max_watches: int = 8
    min_check_interval_ms: float = 250.0


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """The server's memory settings a session needs: whether sessions remember unless they
    say (``default``), how often a keyframe is kept at least (``keyframe_s``) and at most
    (``min_keyframe_s``, for scene changes), what a scene change is, how many moments one
    search may check, what a moment's caption is asked and how long it may be, and how much
    of the captions of what left the window a question's prompt carries."""

    default: bool = True
    keyframe_s: float = 10.0
    min_keyframe_s: float = 1.0
    scene_similarity: float = 0.1
    max_search_moments: int = 3600
    caption_prompt: str = "Describe what you see in a few words."
    caption_tokens: int = 12  # 0: no captions
    context_chars: int = 400  # the captions of what left the window that open its prompts (0: none)


def _any_voice(voice: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class VoicePaths:
    """How this server speaks and listens for a session.

    ``output``: "native" (the engine speaks), a synthesizer's name, or None;
    ``input``: "native" (the engine hears), a transcriber's name, or None;
    ``turn_detection``: a voice activity detector is available (window size in samples).
    """

    output: str | None = None
    input: str | None = None
    vad_window: int | None = None
    default_voice: str | None = None
    knows_voice: Callable[[str], bool] = _any_voice

    @property
    def speaks(self) -> bool:
        """True when answers are spoken by a synthesizer (not by the engine)."""
        return self.output not in {None, "native"}

    @property
    def transcribes(self) -> bool:
        """True when spoken questions are turned into text before the engine sees them."""
        return self.input not in {None, "native"}


#: Settings a ``ConfigUpdate`` cannot change (they shape what was set up at the start).
FIXED_AT_START = frozenset({"model", "prefix_warmup"})


def warm_prefix(config: SessionConfig, capabilities: Capabilities) -> bool:
    """True when a session with ``config`` keeps the engine's prefix warm."""
    return config.prefix_warmup and capabilities.warm_prefix


def opening_config(decode: Callable[[], list[object]]) -> SessionConfig:
    """The session's first message as its ``session.config`` (``decode`` parses it). Raises
    ``invalid_config`` for anything else: a message that does not parse, or another type."""
    try:
        events = decode()
    except SessionError as exc:
        if exc.code in {ErrorCode.INVALID_JSON, ErrorCode.INVALID_MESSAGE, ErrorCode.UNKNOWN_TYPE}:
            raise SessionError(ErrorCode.INVALID_CONFIG, f"the first message must be session.config ({exc.message})") from None
        raise
    event = events[0] if len(events) == 1 else None
    if not isinstance(event, SessionConfig):
        raise SessionError(ErrorCode.INVALID_CONFIG, "the first message must be session.config")
    return event


def negotiate(config: SessionConfig, limits: Limits, capabilities: Capabilities, voice: VoicePaths) -> tuple[SessionConfig, list[str]]:
    """``config`` as this server can serve it, and a note for each change made."""
    notes = []
    if config.sampling.max_tokens > limits.max_answer_tokens:
        config = config.model_copy(
            update={"sampling": config.sampling.model_copy(update={"max_tokens": limits.max_answer_tokens})}
        )
        notes.append(f"sampling.max_tokens lowered to {limits.max_answer_tokens}")
    if "audio" in config.modalities and voice.output is None:
        config = config.model_copy(update={"modalities": ["text"]})
        notes.append("audio output is not available on this server; answers are text only")
    speaking = "audio" in config.modalities and voice.speaks
    if speaking and (config.voice is None or not voice.knows_voice(config.voice)):
        if config.voice is not None:
            notes.append(f"voice {config.voice!r} is not available; using {voice.default_voice!r}")
        config = config.model_copy(update={"voice": voice.default_voice})
    if config.turn_detection is not None and voice.vad_window is None:
        config = config.model_copy(update={"turn_detection": None})
        notes.append("server turn detection is not available on this server; send video.query to ask")
    if config.model and config.model != capabilities.model:
        notes.append(f"model {config.model!r} is not served here; using {capabilities.model!r}")
    most = capabilities.max_images
    if most is not None and config.max_frames > most:
        notes.append(f"max_frames {config.max_frames} is more than the {most} images a prompt may carry "
                     f"on this server; using {most}")
        config = config.model_copy(update={"max_frames": most})
    if config.num_frames is not None and config.num_frames > config.max_frames:
        config = config.model_copy(update={"num_frames": config.max_frames})
    if config.num_frames is None:
        # vLLM-Omni's default without a warm prefix; with one, the whole window
        default = config.max_frames if warm_prefix(config, capabilities) else 4
        config = config.model_copy(update={"num_frames": default})
    return config, notes


@dataclass(frozen=True, slots=True)
class Merged:
    """A ``session.update`` applied to a config (not yet negotiated): ``applied``, the names of
    the changes taken; ``notes``, one for each setting only the start may set
    (``FIXED_AT_START``: kept as it was); ``refused``, each change that is not valid and why."""

    config: SessionConfig
    applied: frozenset[str]
    notes: list[str]
    refused: list[str]


def merge_changes(current: SessionConfig, changes: dict[str, object]) -> Merged:
    """``current`` with a ``session.update``'s ``changes``, part by part: the valid ones are
    applied, the others refused alone."""
    values = current.model_dump(exclude={"type"})
    notes = [f"{name} can only be set when the session starts" for name in sorted(FIXED_AT_START & changes.keys())
             if changes[name] != values.get(name)]
    wanted = {k: v for k, v in changes.items() if k not in FIXED_AT_START}
    refused: list[str] = []
    try:
        config = SessionConfig.model_validate({**values, **wanted})
    except ValidationError:
        for name in list(wanted):
            try:
                SessionConfig.model_validate({**values, name: wanted[name]})
            except ValidationError as exc:
                refused.append(f"{name}: {describe_validation_error(exc)}")
                del wanted[name]
        config = SessionConfig.model_validate({**values, **wanted})  # each part alone was valid
    return Merged(config, frozenset(wanted), notes, refused)
