"""The session core: every decision of a session, with no I/O.

It accepts or filters frames, evicts, buffers audio, selects frames, builds prompts and
decides which error a bad input gets. The adapter in ``session.py`` feeds it events and
carries out what it returns; tests can drive it directly.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from dataclasses import asdict, dataclass, field
from enum import Enum

from handlers.errors import ErrorCode, SessionError
from handlers.frames import Frame, FrameBuffer
from handlers.prompt import Exchange, build_prompt, frame_time_s
from handlers.protocol import (
    ConsumedFrame,
    FrameAck,
    FramesConsumed,
    SessionConfig,
    SessionReady,
    VideoFrame,
    VideoQuery,
)
from handlers.similarity import DEFAULT_THRESHOLD, SimilarityFilter
from handlers.selection import select_frames
from server.engines.base import AudioSegment, Capabilities, Prompt, Sampling


class Phase(Enum):
    AWAITING_CONFIG = "awaiting_config"
    READY = "ready"
    CLOSING = "closing"
    CLOSED = "closed"


_TRANSITIONS = {
    Phase.AWAITING_CONFIG: {Phase.READY, Phase.CLOSED},
    Phase.READY: {Phase.CLOSING, Phase.CLOSED},
    Phase.CLOSING: {Phase.CLOSED},
    Phase.CLOSED: set(),
}


@dataclass(frozen=True, slots=True)
class Limits:
    """The per-session limits a client is told about in ``session.ready``."""

    max_frame_bytes: int
    max_audio_bytes: int
    max_queue: int
    idle_timeout_s: float
    max_history_turns: int
    max_answer_tokens: int


@dataclass(frozen=True, slots=True)
class FrameIntake:
    """What happened to one incoming frame."""

    ack: FrameAck | None
    frame: Frame | None  # the buffered frame, None when filtered
    evicted: list[Frame]


@dataclass
class QueryPlan:
    """One answer: its frames (pinned until ``finish``), question and audio."""

    request_id: str
    question: str
    frames: list[Frame]
    audio: AudioSegment | None
    sampling: Sampling
    text: list[str] = field(default_factory=list)


def decode_base64(data: str, code: ErrorCode, what: str, frame_id: str | int | None = None) -> bytes:
    """Strict base64 (data-URL prefixes allowed). Raises ``SessionError`` with ``code``."""
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise SessionError(code, f"{what} is not valid base64", frame_id=_fid(frame_id)) from None
    if not raw:
        raise SessionError(code, f"{what} is empty", frame_id=_fid(frame_id))
    return raw


def _fid(frame_id: str | int | None) -> str | None:
    return None if frame_id is None else str(frame_id)


class SessionCore:
    """One session's state and decisions."""

    def __init__(self, session_id: str, limits: Limits, capabilities: Capabilities) -> None:
        self.session_id = session_id
        self.limits = limits
        self.capabilities = capabilities
        self.phase = Phase.AWAITING_CONFIG
        self.config = SessionConfig()
        self.buffer = FrameBuffer(self.config.max_frames)
        self.filter = SimilarityFilter(DEFAULT_THRESHOLD, True)
        self.history: list[Exchange] = []
        self.audio = bytearray()
        self.origin: Frame | None = None
        self._seq = itertools.count()
        self._requests = itertools.count(1)
        self.frames_received = 0
        self.frames_filtered = 0

    # ------------------------------------------------------------------ phase
    def move_to(self, phase: Phase) -> None:
        """Change phase; raises ``RuntimeError`` for a transition that is not allowed."""
        if phase not in _TRANSITIONS[self.phase]:
            raise RuntimeError(f"session cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    @property
    def warm_prefix(self) -> bool:
        """True when this session keeps the engine's prefix warm."""
        return self.config.prefix_warmup and self.capabilities.warm_prefix

    # ------------------------------------------------------------------ config
    def configure(self, config: SessionConfig) -> SessionReady:
        """Apply the first message; returns the ``session.ready`` event."""
        notes = []
        if config.sampling.max_tokens > self.limits.max_answer_tokens:
            config = config.model_copy(
                update={"sampling": config.sampling.model_copy(update={"max_tokens": self.limits.max_answer_tokens})}
            )
            notes.append(f"sampling.max_tokens lowered to {self.limits.max_answer_tokens}")
        if "audio" in config.modalities and not self.capabilities.audio_output:
            config = config.model_copy(update={"modalities": ["text"]})
            notes.append("audio output is not available on this server; answers are text only")
        if config.model and config.model != self.capabilities.model:
            notes.append(f"model {config.model!r} is not served here; using {self.capabilities.model!r}")
        self.config = config
        self.buffer = FrameBuffer(config.max_frames)
        self.buffer.bulk_eviction = self.warm_prefix
        threshold = config.frame_filter_threshold
        self.filter = SimilarityFilter(DEFAULT_THRESHOLD if threshold is None else threshold, config.enable_frame_filter)
        self.move_to(Phase.READY)
        effective = config.model_dump(exclude={"type"})
        effective["model"] = self.capabilities.model
        effective["frame_filter_threshold"] = self.filter.threshold
        return SessionReady(
            session_id=self.session_id,
            config=effective,
            limits={**asdict(self.limits), "max_frames": config.max_frames},
            capabilities={**asdict(self.capabilities), "prefix_warmup_active": self.warm_prefix},
            ignored_fields=config.ignored_fields,
            notes=notes,
        )

    # ------------------------------------------------------------------ frames
    def check_frame_size(self, event: VideoFrame) -> None:
        """Raises ``frame_too_large`` before any work is spent on an oversized frame."""
        if len(event.data) > self.limits.max_frame_bytes:
            raise SessionError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame data is {len(event.data)} bytes; the limit is {self.limits.max_frame_bytes}",
                frame_id=_fid(event.frame_id),
            )

    def accept_frame(self, event: VideoFrame, data: bytes, key: str, thumb: object, now_ms: float) -> FrameIntake:
        """Filter and buffer a frame whose bytes decoded; returns the ack and what was evicted."""
        self.frames_received += 1
        decision = self.filter.check(thumb)
        if not decision.keep:
            self.frames_filtered += 1
            return FrameIntake(self._ack(event, now_ms, False, decision.similarity, []), None, [])
        frame = Frame(
            seq=next(self._seq),
            key=key,
            data=data,
            receive_ts_ms=now_ms,
            frame_id=event.frame_id,
            pts_ms=event.pts_ms,
            source_pts_ms=event.source_pts_ms,
            capture_ts_ms=event.capture_ts_ms,
            quality_profile=event.quality_profile,
        )
        if self.origin is None:
            self.origin = frame
        evicted = self.buffer.add(frame)
        return FrameIntake(self._ack(event, now_ms, True, decision.similarity, evicted), frame, evicted)

    def _ack(
        self, event: VideoFrame, now_ms: float, accepted: bool, similarity: float, evicted: list[Frame]
    ) -> FrameAck | None:
        if event.frame_id is None:
            return None
        dropped = [f.frame_id for f in evicted if f.frame_id is not None]
        return FrameAck(
            frame_id=event.frame_id,
            pts_ms=event.pts_ms,
            capture_ts_ms=event.capture_ts_ms,
            accepted=accepted,
            buffered_frames=len(self.buffer),
            server_receive_ts_ms=now_ms,
            reason=None if accepted else "filtered",
            similarity=round(similarity, 4),
            dropped_frame_id=dropped[0] if dropped else None,
            dropped_frame_ids=dropped,
        )

    def reject_frame(self, frame: Frame, reason: str) -> SessionError:
        """A buffered frame failed to decode: remove it; returns the error to send."""
        self.buffer.remove(frame)
        return SessionError(ErrorCode.INVALID_IMAGE, f"image could not be decoded: {reason}", frame_id=_fid(frame.frame_id))

    # ------------------------------------------------------------------ audio
    def add_audio(self, data: str) -> None:
        """Buffer a chunk of PCM16 audio. Raises ``invalid_audio`` or ``audio_overflow``."""
        pcm = self._pcm(data)
        if len(self.audio) + len(pcm) > self.limits.max_audio_bytes:
            self.audio.clear()
            raise SessionError(
                ErrorCode.AUDIO_OVERFLOW,
                f"buffered audio would exceed {self.limits.max_audio_bytes} bytes; the buffer was cleared",
            )
        self.audio.extend(pcm)

    @staticmethod
    def _pcm(data: str) -> bytes:
        pcm = decode_base64(data, ErrorCode.INVALID_AUDIO, "audio")
        if len(pcm) % 2:
            raise SessionError(ErrorCode.INVALID_AUDIO, "PCM16 audio must have an even number of bytes")
        return pcm

    # ------------------------------------------------------------------ queries
    def candidate_frames(self) -> list[Frame]:
        """The frames a query would use now (some may still be decoding)."""
        return select_frames(self.buffer.frames, self.config.num_frames, use_all=self.warm_prefix)

    def plan_query(self, event: VideoQuery) -> QueryPlan:
        """Start an answer: pins its frames and takes the buffered audio.

        Raises ``no_frames`` when nothing is buffered, ``invalid_audio`` for bad audio.
        """
        extra = self._pcm(event.audio_data) if event.audio_data else b""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send video.frame first")
        pcm = bytes(self.audio) + extra
        self.audio.clear()
        audio = AudioSegment(f"audio-{len(pcm)}", pcm) if pcm and self.config.use_audio_in_video else None
        self.buffer.pin(frames)
        sampling = self.config.sampling
        return QueryPlan(
            request_id=f"resp_{self.session_id[:8]}_{next(self._requests)}",
            question=event.text,
            frames=frames,
            audio=audio,
            sampling=Sampling(sampling.temperature, sampling.top_p, sampling.max_tokens, sampling.seed),
        )

    def settle_frames(self, plan: QueryPlan) -> None:
        """Drop the plan's frames whose decode failed. Raises ``no_frames`` if none is left."""
        usable = [f for f in plan.frames if f.image is not None]
        self.buffer.unpin([f for f in plan.frames if f.image is None])
        plan.frames = usable
        if not usable:
            raise SessionError(ErrorCode.NO_FRAMES, "no usable frame is buffered")

    def query_prompt(self, plan: QueryPlan) -> Prompt:
        """The prompt for a planned answer (its frames must be decoded)."""
        return build_prompt(
            system_prompt=self.config.system_prompt,
            history=self.history[-self.limits.max_history_turns :] if self.limits.max_history_turns else [],
            frames=plan.frames,
            origin=self.origin,
            timestamps=self.config.frame_timestamps,
            audio=plan.audio,
            question=plan.question,
        )

    def consumed(self, plan: QueryPlan) -> FramesConsumed:
        """The ``video.frames.consumed`` event: exactly the frames in the prompt."""
        origin = self.origin or plan.frames[0]
        frames = [
            ConsumedFrame(
                frame_id=f.frame_id,
                seq=f.seq,
                pts_ms=f.pts_ms,
                source_pts_ms=f.source_pts_ms,
                capture_ts_ms=f.capture_ts_ms,
                server_receive_ts_ms=f.receive_ts_ms,
                decoded_ts_ms=f.decoded_ts_ms,
                decode_ms=f.decode_ms,
                timestamp_s=round(frame_time_s(f, origin), 3),
            )
            for f in plan.frames
        ]
        pts = [f.pts_ms for f in plan.frames if f.pts_ms is not None]
        return FramesConsumed(
            request_id=plan.request_id,
            frame_ids=[f.frame_id for f in plan.frames],
            frames=frames,
            latest_pts_ms=max(pts) if pts else None,
        )

    def finish(self, plan: QueryPlan, completed_text: str | None) -> None:
        """End an answer: unpin its frames; a non-empty answer joins the history."""
        self.buffer.unpin(plan.frames)
        plan.frames = []
        if completed_text is not None and (plan.question or completed_text):
            self.history.append(Exchange(plan.question, completed_text))
            del self.history[: -max(self.limits.max_history_turns, 1)]

    # ------------------------------------------------------------------ warm prefix
    def warm_frames(self) -> list[Frame]:
        """Frames a warm prefix should cover now: the decoded window, up to the first
        frame still decoding (a prefix cannot skip one)."""
        frames = []
        for frame in self.buffer.frames:
            if frame.image is None:
                break
            frames.append(frame)
        return frames

    def warm_prompt(self, frames: list[Frame]) -> Prompt:
        """The open prefix that a query over ``frames`` would start with."""
        return build_prompt(
            system_prompt=self.config.system_prompt,
            history=self.history[-self.limits.max_history_turns :] if self.limits.max_history_turns else [],
            frames=frames,
            origin=self.origin,
            timestamps=self.config.frame_timestamps,
        )

    def close(self) -> None:
        """Release every frame and buffer; the session is over."""
        self.buffer.close()
        self.audio.clear()
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
