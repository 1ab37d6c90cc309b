"""The session core: every decision of a session, with no I/O.

It accepts or filters frames, evicts, buffers audio, detects spoken turns, selects frames,
keeps the session's timeline (``timeline.py``) and renders prompts from it, and decides which
error a bad input gets. The adapter in ``session.py`` feeds it events and
carries out what it returns; tests can drive it directly.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from enum import Enum


from handlers.core.events import (
    AudioCleared,
    AudioCommitted,
    ConfigUpdated,
    ErrorReported,
    Event,
    FrameAcked,
    OutputAudioCleared,
    SessionReady,
)
from handlers.wire.commands import (
    ClearAudio,
    Command,
    ClearOutputAudio,
    CommitAudio,
    ConfigUpdate,
    DeleteItem,
    RetrieveItem,
    TruncateItem,
    UserInput,
)
from handlers.wire.errors import ErrorCode, SessionError
from handlers.core.frames import Frame, FrameBuffer
from handlers.media.preparation import PreparedFrame
from handlers.core.answer import Answer, Outcome
from handlers.core.jobs import CheckStep
from handlers.core.hearing import Hearing
from handlers.core.memory import Earlier
from handlers.core.lifecycle import EngineSlot
from handlers.core.planning import Planning
from handlers.core.timeline_prompts import TimelinePrompts
from handlers.core.window_slide import Slide, WindowSlide
from handlers.wire.protocol import SessionConfig, TurnDetection, VideoFrame, WatchCreate, WatchDelete, WatchUpdate
from handlers.core.items import Conversation, PendingInput
from handlers.core.timeline import Exchange, Timeline
from handlers.core.watches import Decisions, WatchBook, check_question
from handlers.core.watches import effective as effective_watch
from handlers.core.negotiation import (
    Limits,
    VoicePaths,
    merge_changes,
    negotiate,
    warm_prefix,
)
from handlers.core.camera import Camera, FrameIntake, frame_item, image_side
from handlers.core.check_schedule import CheckSchedule
from handlers.core.microphone import Microphone, audio_ms
from server.engines.base import Capabilities


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


def _vad(turns: TurnDetection | None) -> tuple[float, int, int] | None:
    """What the voice activity detector is built from (the rest of turn detection is policy)."""
    return None if turns is None else (turns.threshold, turns.silence_ms, turns.prefix_padding_ms)


class SessionCore(Hearing, Planning, TimelinePrompts, WindowSlide):
    """One session's state and decisions."""

    def __init__(
        self, session_id: str, limits: Limits, capabilities: Capabilities, voice: VoicePaths | None = None
    ) -> None:
        self.session_id = session_id
        self.limits = limits
        self.capabilities = capabilities
        self.voice = voice or VoicePaths(
            output="native" if capabilities.audio_output else None,
            input="native" if capabilities.audio_input else None,
        )
        self.mic = Microphone(limits.max_audio_bytes)  # the microphone's audio and its turn detector
        self.phase = Phase.AWAITING_CONFIG
        self.config = SessionConfig()
        self.camera = Camera(self.config)  # the frames: buffer, filter, acks
        self.timeline = Timeline(self.config.num_frames or 4)
        self._requests = itertools.count(1)
        self.inputs: list[PendingInput] = []  # items for the next answer (not used by v1)
        self.system_items: dict[str, str] = {}  # system items: text that joins the instructions
        self.speech_item: str | None = None  # the item id of the speech heard now (or last)
        self.items = Conversation(self)  # the conversation's items as a Realtime client edits them
        self.slot = EngineSlot()  # what runs on the engine: a prefill, or the answer asked or running
        self.idle_at: float | None = None  # when silence starts an answer (turn_detection.idle_timeout_ms)
        self._idle_since = 0  # the stream sample the silence counts from
        self._speech_items = itertools.count(1)
        self.watches = WatchBook(limits.max_watches, limits.max_answer_tokens)
        self.earlier = Earlier()  # the captions of what left the window, for questions' context
        self.earlier_chars = 0  # how much of them a question carries (0: none)
        self.check_rounds = CheckSchedule(limits.min_check_interval_ms / 1000)
        self.slide: Slide | None = None  # the window slide under way (``window_slide``)

    # ------------------------------------------------------------------ phase
    def move_to(self, phase: Phase) -> None:
        """Change phase; raises ``RuntimeError`` for a transition that is not allowed."""
        if phase not in _TRANSITIONS[self.phase]:
            raise RuntimeError(f"session cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    @property
    def warm_prefix(self) -> bool:
        """True when this session keeps the engine's prefix warm."""
        return self.warm_prefix_for(self.config)

    def warm_prefix_for(self, config: SessionConfig) -> bool:
        """True when a session with ``config`` keeps the engine's prefix warm."""
        return warm_prefix(config, self.capabilities)

    @property
    def history(self) -> list[Exchange]:
        """The questions and answers of the timeline, oldest first (text history, then live turns)."""
        return [*self.timeline.history, *(Exchange(t.question, t.answer) for t in self.timeline.turns)]

    # ------------------------------------------------------------------ config
    def configure(self, config: SessionConfig) -> SessionReady:
        """Apply the first message; returns the ``SessionReady`` event."""
        config, notes = negotiate(config, self.limits, self.capabilities, self.voice)
        self.config = config
        self.timeline = Timeline(config.num_frames, self.limits.max_history_turns, self.limits.max_history_tokens)
        # a warm prefix the engine cannot move is rebuilt when frames leave it: half the window goes at once
        self.camera = Camera(config, bulk_eviction=self.warm_prefix and not self.capabilities.shifts_prefix)
        self.mic.detect_turns(self._detector(config))
        try:
            self.watches = WatchBook.of(config.watches, self.limits.max_watches, self.limits.max_answer_tokens)
        except SessionError as exc:
            raise SessionError(ErrorCode.INVALID_CONFIG, f"watches: {exc.message}") from None
        self.move_to(Phase.READY)
        return SessionReady(
            session_id=self.session_id,
            config={k: v for k, v in self._effective_config().items() if k != "resume_token"},
            limits={**asdict(self.limits), "max_frames": config.max_frames},
            capabilities={
                **asdict(self.capabilities),
                "prefix_warmup_active": self.warm_prefix,
                "audio_output": self.voice.output is not None,
                "audio_input": self.voice.input is not None,
                "voice_output": self.voice.output if "audio" in config.modalities else None,
                "voice_input": self.voice.input,
                "turn_detection": ["server_vad"] if self.voice.vad_window is not None else [],
            },
            ignored_fields=config.ignored_fields,
            notes=notes,
        )

    def resumed(self, first: SessionReady) -> SessionReady:
        """The ``SessionReady`` of this session taken back by its client: the first one's,
        marked resumed, with the last frame the session took (the client resends after it)."""
        return first.model_copy(update={"resumed": True, "last_frame_id": self.last_frame_id})

    def _effective_config(self) -> dict[str, object]:
        effective = self.config.model_dump(exclude={"type", "watches"})
        effective["watches"] = [effective_watch(w.spec) for w in self.watches]
        effective["model"] = self.capabilities.model
        effective["frame_filter_threshold"] = self.camera.filter.threshold
        return effective

    def update(self, changes: dict[str, object]) -> ConfigUpdated:
        """Change the configuration of a running session; returns the effective one.

        ``model`` and ``prefix_warmup`` keep their first values (a note says so). A smaller
        ``max_frames`` evicts at the next frame. Turning turn detection on or off starts its
        audio afresh. A change that is not valid is refused alone (``refused`` says which and
        why); the others are applied.
        """
        merged = merge_changes(self.config, changes)
        refused = merged.refused
        config, more = negotiate(merged.config, self.limits, self.capabilities, self.voice)
        if "watches" in merged.applied:  # a list of watches replaces the session's
            try:
                self.watches = WatchBook.of(config.watches, self.limits.max_watches, self.limits.max_answer_tokens)
            except SessionError as exc:
                refused.append(f"watches: {exc.message}")
                config = config.model_copy(update={"watches": self.config.watches})
        old = self.config
        self.config = config
        self.camera.reconfigure(old, config)
        if _vad(config.turn_detection) != _vad(old.turn_detection):  # not create/interrupt_response
            self.mic.detect_turns(self._detector(config))
        return ConfigUpdated(config=self._effective_config(), notes=merged.notes + more, refused=refused)

    # ------------------------------------------------------------------ frames
    @property
    def buffer(self) -> FrameBuffer:
        """The buffered frames (the camera's)."""
        return self.camera.buffer

    @property
    def origin(self) -> Frame | None:
        """The session's first frame: the prompt's times count from it."""
        return self.camera.origin

    @property
    def last_frame_id(self) -> str | int | None:
        """The last frame taken: a resumed client resends after it."""
        return self.camera.last_frame_id

    def check_frame_size(self, event: VideoFrame) -> None:
        """Raises ``frame_too_large`` before any work is spent on an oversized frame."""
        self.camera.check_size(event, self.limits.max_frame_bytes)

    def image_side(self, event: VideoFrame) -> int | None:
        """The largest side the frame's picture goes to the model at (``camera.image_side``)."""
        return image_side(event, self.capabilities.max_image_side)

    def accept_frame(self, event: VideoFrame, data: bytes, key: str, thumb: object, now_ms: float) -> FrameIntake:
        """Filter and buffer a frame whose bytes decoded; returns the ack and what was
        evicted. A buffered frame is the conversation's newest item."""
        self.buffer.hold = self.slide_hold()
        intake = self.camera.accept(event, data, key, thumb, now_ms, self.items.tail)
        if intake.frame is not None:
            self.items.appended(frame_item(event.frame_id))
            self.plan_slide(bool(intake.evicted))
        return intake

    def take_frame(self, event: VideoFrame, prepared: PreparedFrame, receive_ms: float, now_ms: float) -> FrameIntake:
        """Filter and buffer a frame prepared off the loop (``preparation.prepare_frame``):
        the buffered frame gets its picture and intake times here, the warm prefix is behind
        (``turns.prefix_behind``) and the watches have a new frame to check. ``receive_ms``:
        when the frame was read; ``now_ms``: now (both wall clock, ms)."""
        key = prepared.key if event.detail != "low" else f"{prepared.key}:low"  # another picture of it
        intake = self.accept_frame(event, prepared.raw, key, prepared.thumb, receive_ms)
        if intake.frame is not None:
            intake.frame.image = prepared.image
            intake.frame.decode_ms = prepared.decode_ms
            intake.frame.decoded_ts_ms = now_ms
        if intake.frame is not None:
            self.watch_frame_accepted()
        warm_due = self.warm_prefix and (intake.frame is not None or bool(intake.evicted))
        if warm_due:
            self.slot.prefix_behind()
        return replace(intake, warm_due=warm_due)

    def shed_frame(self, event: VideoFrame, now_ms: float) -> FrameAcked | None:
        """A frame dropped at intake because the server cannot keep up: its ack says so."""
        return self.camera.shed(event, now_ms, self.items.tail)

    @property
    def running(self) -> Answer | None:
        """The answer asked or running, until its end or withdrawal."""
        return self.slot.answer

    def ask(self, answer: Answer, received: float) -> bool:
        """Ask the session for a planned answer (``received``: when the question came, in
        seconds on the caller's clock): it becomes the turn's answer and, in the conversation,
        its newest item. Returns True when a running prefill must be stopped before it may
        start (``turns.may_generate``). Raises ``IllegalTransition`` while another is asked or
        running: the caller interrupts it, and waits for its end, first."""
        answer.received = received
        answer.previous_item_id = self.items.tail
        stop_prefill = self.slot.ask(answer)
        if answer.in_conversation:
            self.items.appended(answer.item_id)
        return stop_prefill

    def withdraw(self, answer: Answer) -> None:
        """The asked answer will not start (nothing of it was sent): its frames may go."""
        self._release(answer)
        self.slot.withdraw()

    def end_answer(self, answer: Answer, outcome: Outcome, now: float, error_code: str | None = None) -> list[Event]:
        """End the running answer; returns its closing events (``Answer.end``: text done,
        audio done, ``AnswerEnded`` with the cause or error code). Its frames may go, what
        it said joins the timeline (``_keep``), the turn is over (the prefix is behind), and
        with an idle timeout, silence from when its audio has played (``now``, seconds on the
        caller's clock) starts an answer: once, not after the answer a silence started."""
        events = answer.end(outcome, now, error_code)
        self._release(answer)
        self._keep(answer)
        self.slot.end()
        turns = self.config.turn_detection
        if turns is not None and turns.idle_timeout_ms is not None and self.detector is not None:
            if not answer.after_silence:
                self.idle_at = now + answer.audio_ms / 1000 + turns.idle_timeout_ms / 1000
                self._idle_since = self.mic.total
        return events

    # ------------------------------------------------------------------ conversation items
    def apply(self, command: Command) -> list[Event]:
        """Carry out a command that starts no answer; returns the events to send.

        Raises ``SessionError`` (``invalid_message``, ``invalid_audio``, ``audio_overflow``,
        ``item_not_found``).
        """
        if isinstance(command, ConfigUpdate):
            updated = self.update(command.changes).model_copy(update={"ignored": command.ignored})
            refused = [*command.refused, *updated.refused]
            if not refused:
                return [updated]
            error = ErrorReported(code=ErrorCode.INVALID_MESSAGE.value,
                               message="session.update: not applied: " + "; ".join(refused)[:2000])
            return [updated.model_copy(update={"refused": refused}), error]
        if isinstance(command, UserInput):
            return [self.items.add(command)]
        if isinstance(command, TruncateItem):
            return [self.items.truncate(command)]
        if isinstance(command, ClearOutputAudio):
            return [OutputAudioCleared()]
        if isinstance(command, CommitAudio):
            return [self._commit_audio(command.item_id)]
        if isinstance(command, ClearAudio):
            self.mic.clear()
            return [AudioCleared()]
        if isinstance(command, DeleteItem):
            return [self.items.delete(command.item_id)]
        if isinstance(command, RetrieveItem):
            return [self.items.retrieve(command.item_id)]
        raise SessionError(ErrorCode.INVALID_MESSAGE, f"{command.type} is not carried out here")

    def system_text(self) -> str | None:
        """The instructions: the configured system prompt, then each system item."""
        parts = [p for p in (self.config.system_prompt, *self.system_items.values()) if p]
        return "\n\n".join(parts) if parts else None

    def pending_audio_bytes(self) -> int:
        """The audio the pending inputs hold, in bytes."""
        return sum(len(i.pcm16) for i in self.inputs)

    _pending_audio_bytes = pending_audio_bytes

    def _commit_audio(self, item_id: str) -> AudioCommitted:
        if self.detector is not None:
            # nothing waits to be committed: turn detection commits each spoken turn itself
            raise SessionError(ErrorCode.INVALID_AUDIO, "turn detection is on: the server commits the audio itself")
        if not self.mic.buffer:
            raise SessionError(ErrorCode.INVALID_AUDIO, "no audio is buffered to commit")
        if self._pending_audio_bytes() + len(self.mic.buffer) > self.limits.max_audio_bytes:
            raise SessionError(ErrorCode.AUDIO_OVERFLOW, f"pending audio would exceed {self.limits.max_audio_bytes} bytes")
        pcm = self.mic.take()
        self.inputs.append(PendingInput(item_id, None, pcm))
        previous = self.items.tail
        self.items.appended(item_id)
        return AudioCommitted(item_id=item_id, audio_ms=audio_ms(pcm), previous_item_id=previous)

    # ------------------------------------------------------------------ watches
    def apply_watch(self, event: WatchCreate | WatchUpdate | WatchDelete) -> list[Event]:
        """``watch.create`` / ``.update`` / ``.delete``; returns the event to send. Raises
        ``invalid_watch``, ``unknown_watch`` and ``too_many_watches``."""
        return [self.watches.apply(event)]

    def watch_frame_accepted(self) -> None:
        """An accepted frame: the watches have something new to look at."""
        if len(self.watches):
            self.check_rounds.frame_accepted()

    def skipped_checks(self) -> int:
        """The accepted frames no check has looked at and no round has told yet (the newest
        one too, if it is still unchecked); told once: the count starts again from zero."""
        return self.check_rounds.told_at_end(bool(len(self.watches)))

    def check_due(self, now_s: float) -> float | None:
        """None when no check is wanted (no watch, or nothing new since the last round); else
        the seconds to wait before one may run (0: now). ``now_s``: the caller's monotonic clock."""
        return self.check_rounds.due(now_s) if len(self.watches) else None

    def check_overdue(self) -> bool:
        """True when a round should go before the next prefill (``check_schedule.OVERDUE_FRAMES``)."""
        return bool(len(self.watches)) and self.check_rounds.overdue

    def next_check(self, now_s: float) -> CheckStep | None:
        """The round of checks due now over the warm prefix (its frames pinned until
        ``checked``), or None when the timeline holds no frame yet. A paced engine's prefix may
        be behind the buffer (``Capabilities.warm_interval_s``): the timeline is brought up to
        date first, so the round looks at the newest frame and its request warms what it adds."""
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        frames = self.timeline.frames
        if not frames:
            return None
        self.check_rounds.started(now_s)
        self.buffer.pin(frames)
        prompts = [(w.watch_id, self._render(check_question(w.spec))) for w in self.watches]
        return CheckStep(frames, prompts, frames[-1])

    def checked(self, step: CheckStep, results: list[tuple[str, float, float]] | None, now_s: float,
                now_ms: float) -> Decisions:
        """A round of checks ended: unpin its frames and, when it ran to the end (``results``:
        watch id, probability, ms), apply it; returns what to send and the fires."""
        self.buffer.unpin(step.frames)
        if results is None:  # stopped by a question: the frame is checked again later
            decisions = Decisions()
        else:
            decision_ms = None if step.frame is None else now_ms - step.frame.receive_ts_ms
            decisions = self.watches.record(results, step.frame, now_s, decision_ms)
            decisions.checks = len(results)
        decisions.skipped = self.check_rounds.ended(results is not None)
        return decisions

    def close(self) -> None:
        """Release every frame and buffer; the session is over."""
        self.buffer.close()
        self.mic.clear()
        self.inputs.clear()
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
