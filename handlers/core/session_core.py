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


from handlers.wire.commands import (
    AnswerRequest,
    AudioCleared,
    AudioCommitted,
    ClearAudio,
    Command,
    ClearOutputAudio,
    CommitAudio,
    ConfigUpdate,
    ConfigUpdated,
    DeleteItem,
    IdleTimeout,
    InputMessage,
    InputTranscribed,
    OutputAudioCleared,
    RetrieveItem,
    TruncateItem,
    UserInput,
)
from handlers.wire.errors import ErrorCode, SessionError
from handlers.core.frames import Frame, FrameBuffer
from handlers.media.preparation import PreparedFrame
from handlers.core.answer import Answer, Outcome
from handlers.core.jobs import CheckStep, WarmStep
from handlers.core.lifecycle import Turns
from handlers.core.prompt import render_timeline
from handlers.wire.protocol import (
    ErrorEvent,
    FrameAck,
    InputAudioSpeechStarted,
    InputAudioSpeechStopped,
    ServerEvent,
    SessionConfig,
    SessionReady,
    TurnDetection,
    ResponseTrigger,
    VideoFrame,
    VideoQuery,
    WatchCreate,
    WatchDelete,
    WatchUpdate,
)
from handlers.core.items import Conversation, PendingInput
from handlers.core.timeline import Exchange, Message, Timeline, TimelineTurn, heard_text, interrupted_answer
from handlers.core.watches import WATCH_ANSWER_TOKENS, Decisions, Fire, WatchBook, check_question
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
from handlers.core.microphone import Microphone, SpokenQuestion, audio_ms, decode_pcm
from handlers.core.turn_detection import RATE, SpeechStarted, TurnDetector, TurnEvent
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


def _spoken(inputs: list[PendingInput]) -> str:
    """The words of ``inputs`` that were transcribed speech."""
    return "\n".join(i.text for i in inputs if i.spoken and i.text)


def _vad(turns: TurnDetection | None) -> tuple[float, int, int] | None:
    """What the voice activity detector is built from (the rest of turn detection is policy)."""
    return None if turns is None else (turns.threshold, turns.silence_ms, turns.prefix_padding_ms)


class SessionCore:
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
        self.turns = Turns()  # what runs on the engine: a prefill, or the answer asked or running
        self.idle_at: float | None = None  # when silence starts an answer (turn_detection.idle_timeout_ms)
        self._idle_since = 0  # the stream sample the silence counts from
        self._speech_items = itertools.count(1)
        self.watches = WatchBook(limits.max_watches, limits.max_answer_tokens)
        self.check_rounds = CheckSchedule(limits.min_check_interval_ms / 1000)

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
        """Apply the first message; returns the ``session.ready`` event."""
        config, notes = negotiate(config, self.limits, self.capabilities, self.voice)
        self.config = config
        self.timeline = Timeline(config.num_frames, self.limits.max_history_turns, self.limits.max_history_tokens)
        self.camera = Camera(config, bulk_eviction=self.warm_prefix)
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
        """The ``session.ready`` of this session taken back by its client: the first one's,
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
        intake = self.camera.accept(event, data, key, thumb, now_ms, self.items.tail)
        if intake.frame is not None:
            self.items.appended(frame_item(event.frame_id))
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
            self.turns.prefix_behind()
        return replace(intake, warm_due=warm_due)

    def shed_frame(self, event: VideoFrame, now_ms: float) -> FrameAck | None:
        """A frame dropped at intake because the server cannot keep up: its ack says so."""
        return self.camera.shed(event, now_ms, self.items.tail)

    # ------------------------------------------------------------------ audio
    @property
    def detector(self) -> TurnDetector | None:
        """The turn detector, when server turn detection is on."""
        return self.mic.detector

    def _detector(self, config: SessionConfig) -> TurnDetector | None:
        turns = config.turn_detection
        if turns is None or self.voice.vad_window is None:
            return None
        return TurnDetector(turns.threshold, turns.silence_ms, self.voice.vad_window)

    def _padding(self) -> int:
        turns = self.config.turn_detection
        return 0 if turns is None else turns.prefix_padding_ms * RATE // 1000

    def add_audio(self, data: str) -> bytes:
        """Buffer a chunk of PCM16 audio; returns its samples. Raises ``invalid_audio``, or
        ``audio_overflow`` (without turn detection: with it, the oldest audio is dropped)."""
        pcm = decode_pcm(data)
        self.mic.add(pcm)
        return pcm

    def detect_turns(self, probabilities: list[float]) -> list[TurnEvent | SpokenQuestion]:
        """Judge the next voice-activity windows (turn detection must be on).

        Returns, in order, ``SpeechStarted`` for each start and, for each stop, the
        ``SpeechStopped`` followed by the ``SpokenQuestion`` to answer (its audio runs from
        ``prefix_padding_ms`` before the start to where the silence was complete), named by
        the speech's item id. While nobody speaks, only the padding's worth of audio is kept.
        """
        out = self.mic.heard(probabilities, self._padding())
        for n, event in enumerate(out):
            if isinstance(event, SpeechStarted):
                self.speech_item = f"item_speech_{self.session_id[:8]}_{next(self._speech_items)}"
                self.idle_at = None  # someone speaks: no answer for the silence
            elif isinstance(event, SpokenQuestion):
                out[n] = replace(event, item_id=self.speech_item or "")
        return out

    def listen_start(self) -> int | None:
        """Where the audio of the question being spoken now begins (a stream sample), or None
        when no question audio is building up: with turn detection, from the padding before the
        speech that has started; without it, the whole buffer (the next query takes it)."""
        if not (self.voice.transcribes and self.config.use_audio_in_video):
            return None
        return self.mic.question_start(self._padding())

    def turn_event(self, decision: TurnEvent) -> InputAudioSpeechStarted | InputAudioSpeechStopped:
        """The event that tells the client speech started or stopped (with the speech's item id)."""
        if isinstance(decision, SpeechStarted):
            return InputAudioSpeechStarted(audio_start_ms=decision.start_ms, item_id=self.speech_item)
        previous = self.items.tail
        self.items.appended(self.speech_item)  # the spoken item joins the conversation now
        return InputAudioSpeechStopped(
            audio_start_ms=decision.start_ms, audio_end_ms=decision.end_ms, item_id=self.speech_item,
            previous_item_id=previous,
        )

    @property
    def speech_interrupts(self) -> bool:
        """True when speech that starts interrupts the running answer (``interrupt_response``)."""
        turns = self.config.turn_detection
        return turns is None or turns.interrupt_response

    def answers_speech(self, answering: bool) -> bool:
        """True when a spoken question is answered at once (``create_response``); with an answer
        running, only when speech may interrupt it. Otherwise ``hold_spoken_question``."""
        turns = self.config.turn_detection
        return turns is None or (turns.create_response and (not answering or turns.interrupt_response))

    def hold_spoken_question(self, question: SpokenQuestion) -> PendingInput:
        """Keep a spoken question as an input of the next answer (a client's ``response.create``
        or the next question); returns it. Raises ``audio_overflow``."""
        if self._pending_audio_bytes() + len(question.pcm16) > self.limits.max_audio_bytes:
            raise SessionError(ErrorCode.AUDIO_OVERFLOW, f"pending audio would exceed {self.limits.max_audio_bytes} bytes")
        item = PendingInput(question.item_id, None, question.pcm16)
        self.inputs.append(item)
        return item

    def transcribed_input(self, item_id: str, transcript: str) -> InputTranscribed | None:
        """A held spoken input's words replace its audio; returns the event to send, or None
        when the input is gone (deleted, or taken by an answer meanwhile)."""
        item = next((i for i in self.inputs if i.item_id == item_id and i.pcm16), None)
        if item is None:
            return None
        length_ms = audio_ms(item.pcm16)
        item.text, item.pcm16, item.spoken = transcript.strip() or None, b"", True
        if item.text is None:
            self.inputs.remove(item)
        return InputTranscribed(item_id=item_id, transcript=transcript, audio_ms=length_ms)

    @staticmethod
    def audio_ms(pcm16: bytes) -> float:
        """How long 16 kHz PCM16 audio is, in ms."""
        return audio_ms(pcm16)

    def pcm(self, data: str) -> bytes:
        """Base64 PCM16 as bytes. Raises ``invalid_audio``."""
        return decode_pcm(data)

    # ------------------------------------------------------------------ queries
    def candidate_frames(self) -> list[Frame]:
        """The frames a query may use now (some may still be decoding): the timeline's, then
        the buffered frames that arrived after the last one it considered."""
        held = self.timeline.frames
        newer = [f for f in self.buffer.frames if not held or f.seq > held[-1].seq]
        return [f for f in held if f.in_window] + newer

    def plan_query(self, event: VideoQuery) -> Answer:
        """Start an answer: pins its frames and takes the buffered audio (with turn detection
        on, the buffer belongs to the detector: only ``audio_data`` is taken).

        Raises ``no_frames`` when nothing is buffered, ``invalid_audio`` for bad audio.
        """
        extra = decode_pcm(event.audio_data) if event.audio_data else b""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send video.frame first")
        pcm = extra
        if self.detector is None:
            pcm = self.mic.take() + extra
        # spoken turns held by turn detection (create_response off) come first; v1 has no other inputs
        held = [i.text for i in self.inputs if i.text]
        pcm = b"".join(i.pcm16 for i in self.inputs) + pcm
        question = "\n".join([*held, event.text]) if held else event.text
        spoken = _spoken(self.inputs)
        input_ids = [i.item_id for i in self.inputs]
        self.inputs.clear()
        audio = AudioSegment(f"audio-{len(pcm)}", pcm) if pcm and self.config.use_audio_in_video else None
        answer = self._plan(frames, question, audio)
        answer.spoken, answer.input_ids = spoken, input_ids
        return answer

    def plan_spoken_query(self, question: SpokenQuestion) -> Answer:
        """Start an answer to a question turn detection found. Raises ``no_frames``."""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the spoken question; send video.frame first")
        answer = self._plan(frames, "", AudioSegment(f"audio-{len(question.pcm16)}", question.pcm16))
        answer.input_ids = [question.item_id] if question.item_id else []
        return answer

    def plan_idle(self) -> tuple[Answer, IdleTimeout]:
        """The answer a silence starts (no question: the conversation so far prompts it), and
        the event that says why. Raises ``no_frames``."""
        self.idle_at = None
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the idle timeout's answer")
        item_id = f"item_idle_{self.session_id[:8]}_{next(self._speech_items)}"
        event = IdleTimeout(item_id=item_id, audio_start_ms=self._idle_since * 1000 / RATE,
                            audio_end_ms=self.mic.total * 1000 / RATE)
        answer = self._plan(frames, "", None)
        answer.after_silence = True
        return answer, event

    def _plan(
        self, frames: list[Frame], question: str, audio: AudioSegment | None, request: AnswerRequest | None = None
    ) -> Answer:
        self.idle_at = None  # an answer is asked: the silence it waited for is over
        self.buffer.pin(frames)
        sampling = self.config.sampling
        max_tokens = sampling.max_tokens
        modalities = list(self.config.modalities)
        if request is not None and request.max_tokens is not None:
            max_tokens = min(request.max_tokens, self.limits.max_answer_tokens)
        if request is not None and request.modalities is not None:
            wanted = [m for m in request.modalities if m == "text" or self.voice.output is not None]
            modalities = list(dict.fromkeys(["text", *wanted]))
        number = next(self._requests)
        return Answer(
            request_id=f"resp_{self.session_id[:8]}_{number}",
            item_id=f"item_answer_{self.session_id[:8]}_{number}",
            question=question,
            frames=frames,
            audio=audio,
            sampling=Sampling(sampling.temperature, sampling.top_p, max_tokens, sampling.seed),
            modalities=modalities,
            instructions=request.instructions if request is not None else None,
        )

    def refuse_cancel(self, asked: bool) -> SessionError | None:
        """A cancel of the running answer (``response.cancel`` on ``/v1/realtime``): the error
        it gets when nothing is running and none is ``asked`` (read, not yet planned), else None."""
        if self.running is None and not asked:
            return SessionError(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, "there is no response in progress to cancel")
        return None

    @staticmethod
    def configured_again() -> SessionError:
        """What a second ``session.config`` gets (the session goes on as it was)."""
        return SessionError(ErrorCode.INVALID_MESSAGE, "the session is already configured")

    def check_request(self, request: AnswerRequest, answering: bool) -> None:
        """Raises ``conversation_already_has_active_response`` for an exclusive request while
        an answer is asked or running (OpenAI Realtime runs one response at a time)."""
        if request.exclusive and answering:
            raise SessionError(
                ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
                "a response is in progress; wait for its response.done (or cancel it) before creating another",
            )

    def plan_answer(self, request: AnswerRequest) -> Answer:
        """Start an answer over the pending inputs (their text is the question, their audio
        the spoken part); the inputs are used up unless the answer stays out of the
        conversation. With ``input``, the answer's context is only that: its messages, and
        the frames it names (else the buffered ones). Raises ``no_frames`` (inputs are kept)
        and ``item_not_found`` (an input naming no item)."""
        if request.input is not None:
            return self._plan_own_context(request)
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send an image first")
        question = "\n".join(i.text for i in self.inputs if i.text)
        pcm = b"".join(i.pcm16 for i in self.inputs)
        spoken = _spoken(self.inputs)
        input_ids = [i.item_id for i in self.inputs]
        if request.in_conversation:
            self.inputs.clear()
        audio = AudioSegment(f"audio-{len(pcm)}", pcm) if pcm and self.config.use_audio_in_video else None
        answer = self._plan(frames, question, audio, request)
        answer.spoken, answer.input_ids = spoken, input_ids if request.in_conversation else []
        answer.in_conversation, answer.metadata = request.in_conversation, request.metadata
        return answer

    def _plan_own_context(self, request: AnswerRequest) -> Answer:
        messages: list[InputMessage] = []
        frames: list[Frame] = []
        for part in request.input or []:
            if part.item_id is None:
                messages.append(part)
                continue
            frame = next((f for f in self.buffer.frames if f.frame_id is not None and str(f.frame_id) == part.item_id), None)
            if frame is not None:
                frames.append(frame)
                continue
            found = self.items.retrieve(part.item_id)  # raises item_not_found
            if found.text:
                role = found.role if found.role != "system" else "user"
                messages.append(InputMessage(role=role, text=found.text))
        frames = frames or self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send an image first")
        question = "\n".join(m.text for m in messages if m.text and m.role == "user")
        answer = self._plan(frames, question, None, request)
        answer.context, answer.metadata = messages, request.metadata
        answer.in_conversation = request.in_conversation
        return answer

    @property
    def running(self) -> Answer | None:
        """The answer asked or running, until its end or withdrawal."""
        return self.turns.answer

    def ask(self, answer: Answer, received: float) -> bool:
        """Ask the session for a planned answer (``received``: when the question came, in
        seconds on the caller's clock): it becomes the turn's answer and, in the conversation,
        its newest item. Returns True when a running prefill must be stopped before it may
        start (``turns.may_generate``). Raises ``IllegalTransition`` while another is asked or
        running: the caller interrupts it, and waits for its end, first."""
        answer.received = received
        answer.previous_item_id = self.items.tail
        stop_prefill = self.turns.ask(answer)
        if answer.in_conversation:
            self.items.appended(answer.item_id)
        return stop_prefill

    def withdraw(self, answer: Answer) -> None:
        """The asked answer will not start (nothing of it was sent): its frames may go."""
        self._release(answer)
        self.turns.withdraw()

    def end_answer(self, answer: Answer, outcome: Outcome, now: float, error_code: str | None = None) -> list[ServerEvent]:
        """End the running answer; returns its closing events (``Answer.end``: text done,
        audio done, ``response.done`` with the cause or error code). Its frames may go, what
        it said joins the timeline (``_keep``), the turn is over (the prefix is behind), and
        with an idle timeout, silence from when its audio has played (``now``, seconds on the
        caller's clock) starts an answer: once, not after the answer a silence started."""
        events = answer.end(outcome, now, error_code)
        self._release(answer)
        self._keep(answer)
        self.turns.end()
        turns = self.config.turn_detection
        if turns is not None and turns.idle_timeout_ms is not None and self.detector is not None:
            if not answer.after_silence:
                self.idle_at = now + answer.audio_ms / 1000 + turns.idle_timeout_ms / 1000
                self._idle_since = self.mic.total
        return events

    # ------------------------------------------------------------------ conversation items
    def apply(self, command: Command) -> list[ServerEvent]:
        """Carry out a command that starts no answer; returns the events to send.

        Raises ``SessionError`` (``invalid_message``, ``invalid_audio``, ``audio_overflow``,
        ``item_not_found``).
        """
        if isinstance(command, ConfigUpdate):
            updated = self.update(command.changes).model_copy(update={"ignored": command.ignored})
            refused = [*command.refused, *updated.refused]
            if not refused:
                return [updated]
            error = ErrorEvent(code=ErrorCode.INVALID_MESSAGE.value,
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

    def needs_transcription(self, answer: Answer) -> bool:
        """True when the answer's audio must become text (the engine takes no audio)."""
        return answer.audio is not None and self.voice.transcribes

    def settle_frames(self, answer: Answer) -> None:
        """Drop the answer's frames whose decode failed. Raises ``no_frames`` if none is left."""
        usable = [f for f in answer.frames if f.image is not None]
        self.buffer.unpin([f for f in answer.frames if f.image is None])
        answer.frames = usable
        if not usable:
            raise SessionError(ErrorCode.NO_FRAMES, "no usable frame is buffered")

    def query_prompt(self, answer: Answer) -> Prompt:
        """The prompt for a planned answer (its frames must be decoded): the timeline with the
        answer's new frames admitted (its newest always) and the question closing the open turn.
        Sets ``answer.used``, the frames the prompt holds."""
        answer.prompted = True
        answer.origin = self.origin
        if answer.context is not None:  # the answer's own context, not the timeline
            answer.used = [f for f in answer.frames if f.image is not None]
            return self._render_context(answer)
        timeline = self.timeline
        timeline.forget_evicted()
        usable = [f for f in answer.frames if f.image is not None]
        timeline.admit(usable, newest=usable[-1] if usable else None)
        answer.used = timeline.frames
        return replace(self._render(answer.question, answer.audio, answer.instructions), spoken=answer.spoken)

    def _render_context(self, answer: Answer) -> Prompt:
        """An answer's own ``input``: its messages in order, the frames first, the last user
        message asking."""
        messages = answer.context or []
        last_user = max((n for n, m in enumerate(messages) if m.role == "user"), default=None)
        turns = []
        for n, m in enumerate(messages):
            if n != last_user:
                turns.append(TimelineTurn([], [Message(m.role if m.role != "system" else "user", m.text or "")]))
        question = messages[last_user].text or "" if last_user is not None else ""
        return render_timeline(
            system_prompt=answer.instructions or self.system_text(), history=(), turns=turns,
            open_frames=answer.used, origin=self.origin, timestamps=self.config.frame_timestamps, question=question,
        )

    def _render(self, question: str | None, audio: AudioSegment | None = None, instructions: str | None = None) -> Prompt:
        timeline = self.timeline
        return render_timeline(
            system_prompt=instructions or self.system_text(),
            history=timeline.history,
            turns=timeline.turns,
            open_frames=timeline.open,
            origin=self.origin,
            timestamps=self.config.frame_timestamps,
            audio=audio,
            question=question,
        )

    def _release(self, answer: Answer) -> None:
        self.buffer.unpin(answer.frames)
        answer.frames = []

    def _keep(self, answer: Answer) -> None:
        """What an ended answer leaves in the timeline. One that reached the engine closes
        the open turn with its text as generated (a failed one leaves the turn open); an
        interrupted one keeps the text it got to, marked (``timeline.INTERRUPTED_MARK``); one
        the client truncated while it ran keeps what was heard, one it deleted only its
        question. An answer out of the conversation leaves the timeline as it was."""
        kept = answer.kept_text
        if kept is None or not answer.prompted or not answer.in_conversation:
            return
        text = interrupted_answer(kept) if answer.outcome is Outcome.INTERRUPTED else kept
        pieces = answer.audio_pieces
        reply = Message("assistant", text, (answer.item_id,), tuple(pieces))
        if answer.heard_ms is not None and pieces:
            heard = heard_text(reply, answer.heard_ms)
            cut = tuple(p for p in pieces if p[0] <= answer.heard_ms)
            reply = Message("assistant", heard, (answer.item_id,), (*cut, (float(answer.heard_ms), "")))
        question = Message("user", answer.question, tuple(answer.input_ids))
        if answer.context is not None:
            self.close_open_turn([] if answer.deleted else [reply])
        else:
            self.timeline.close_with([question] if answer.deleted else [question, reply])

    def close_open_turn(self, messages: list[Message]) -> None:
        """The client put an assistant message at the end: the frames shown since the last
        turn (the decoded ones) and ``messages`` become a turn."""
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        self.timeline.close_with(messages)
        self.timeline.edited = True

    # ------------------------------------------------------------------ warm prefix
    def warm_frames(self) -> list[Frame]:
        """Bring the timeline up to date with the buffer (evicted frames out, decoded new
        frames in, up to the first still decoding) and return its frames: what a warm
        prefix covers now. Returns none when there is nothing to warm: no frame has come
        since the last answer and none has left (the answer itself is cached already).
        Frames that left during an answer are forgotten here or by the next query."""
        before = self.timeline.frames
        self.timeline.forget_evicted()
        self.timeline.admit(self.buffer.frames)
        frames = self.timeline.frames
        edited, self.timeline.edited = self.timeline.edited, False
        if not self.timeline.open and frames == before and not edited:
            return []
        return frames

    def warm_prompt(self, frames: list[Frame] | None = None) -> Prompt:
        """The open prefix that the next query will start with (``frames``: ``warm_frames()``)."""
        return self._render(None)

    def next_warm(self) -> WarmStep | None:
        """The prefill due now (its frames pinned until ``warmed``), or None when the
        engine's prefix already covers everything (``warm_frames``)."""
        frames = self.warm_frames()
        if not frames:
            return None
        self.buffer.pin(frames)
        return WarmStep(frames, self.warm_prompt(frames))

    def warmed(self, step: WarmStep) -> None:
        """A prefill ended (done, failed or stopped by a question): its frames may go."""
        self.buffer.unpin(step.frames)

    # ------------------------------------------------------------------ watches
    def apply_watch(self, event: WatchCreate | WatchUpdate | WatchDelete) -> list[ServerEvent]:
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

    def next_check(self, now_s: float) -> CheckStep | None:
        """The round of checks due now over the warm prefix (its frames pinned until
        ``checked``), or None when the timeline holds no frame yet."""
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

    def plan_watch(self, fire: Fire) -> Answer:
        """The answer to a fired watch: over the buffered frames, asked its watch's question,
        marked with its trigger. Raises ``no_frames``."""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the watch's answer")
        spec = fire.watch.spec
        answer = self._plan(frames, fire.question, None)
        tokens = min(spec.response.max_tokens or WATCH_ANSWER_TOKENS, self.limits.max_answer_tokens)
        answer.sampling = replace(answer.sampling, max_tokens=tokens)
        answer.trigger = ResponseTrigger(watch_id=fire.watch.watch_id)
        return answer

    def close(self) -> None:
        """Release every frame and buffer; the session is over."""
        self.buffer.close()
        self.mic.clear()
        self.inputs.clear()
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSED
