"""A session's core as one machine: inputs and job results in, effects out (``effects.py``).

``SessionMachine`` decides everything a session does between its transport and its engine:
what a control message answers and what it interrupts (and with what cause), whether a cancel
is refused, when a question waits for the running answer's end, when a prefill or a round of
watch checks runs and when a question stops it, whether a round was preempted, which fire
starts an answer (only with nothing asked or running; only the first), when the idle timeout
asks for one, whether to re-warm after an item edit or reopen the voice activity stream,
whether a spoken question is answered, held or transcribed, what of the engine's own audio is
trimmed, and which error each bad input gets. It does no I/O and reads no clock: ``now`` comes
with every call, so a test drives it with a list of inputs and results (``tests/core/run_core.py``).

The state it decides over (frames, audio, timeline, watches, the engine's turn) is the
``SessionCore``. An executor calls it through its entry points (``ENTRY_POINTS``: configure
or resume it, ``receive``, ``completed``, ``close``) and reads only its documented surface
(``SURFACE``); ``tests/core/project/test_layers.py`` holds ``handlers/session`` to both.

Engine work is one job at a time (``lifecycle.EngineSlot``): a question asked during a prefill or a
round of checks stops it, and its answer starts when the stopped job is reported ended; an
input that plans an answer while another is asked or running stops that one (cause
``question``) and waits, with every lane input after it, until its end (``Ended``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from handlers.core.answer import Answer
from handlers.core.effects import (
    Checked,
    Closed,
    Effect,
    Ended,
    EndSession,
    FrameShed,
    Generate,
    Generated,
    Handle,
    Captioned,
    HeldTranscribed,
    MemoryForgotten,
    MemoryFound,
    MomentsLoaded,
    Recalled,
    Input,
    Now,
    Opened,
    Refused,
    Source,
    error_event,
    Prepare,
    Prepared,
    Read,
    ResetVad,
    Result,
    Send,
    Speak,
    SpeechDetected,
    Spoken,
    StartAnswer,
    Stop,
    StopListening,
    Tally,
    Tick,
    Transcribed,
    Warmed,
)
from handlers.core.events import ErrorReported, Pong, SessionDone, SessionReady
from handlers.core.jobs import CaptionStep, CheckStep, WarmStep
from handlers.core.lifecycle import SlotState
from handlers.core.native_audio import NativeAudioTrim
from handlers.core.negotiation import Limits, MemoryPolicy, VoicePaths
from handlers.core.session_core import Phase, SessionCore
from handlers.core.engine_jobs import EngineJobs
from handlers.core.memory import Keyframes, SearchRun
from handlers.core.memory_decisions import MemoryDecisions
from handlers.core.speech_decisions import SpeechDecisions
from handlers.wire.commands import AnswerRequest, CancelRequest, ClearOutputAudio, Command
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.protocol import (
    AudioChunkIn,
    MemoryClear,
    MemorySearch,
    Ping,
    ResponseCancel,
    SessionConfig,
    VideoDone,
    VideoFrame,
    VideoQuery,
    WatchCreate,
    WatchDelete,
    WatchUpdate,
    origin_of,
)
from server.engines.base import AudioChunk, Capabilities, TextDelta


WATCH_EVENTS = (WatchCreate, WatchUpdate, WatchDelete)
#: Client events answered when read (``Read``), never queued in a lane.
CONTROL = (Ping, ResponseCancel, CancelRequest, SessionConfig)


@dataclass
class _Asked:
    """What comes with the asked answer when it starts: events to send before its
    ``response.start`` (a watch's fire, an idle timeout) and whether it takes the running
    transcription."""

    before: list[Effect]
    take_listening: bool


class SessionMachine(SpeechDecisions, EngineJobs, MemoryDecisions):
    """One session's decisions (see the module docstring)."""

    #: What an executor calls.
    ENTRY_POINTS = frozenset({"configure", "resumed", "receive", "completed", "close"})
    #: What an executor may read (properties; ``limits`` and ``config`` are read-only values).
    SURFACE = frozenset({
        "session_id", "phase", "limits", "config", "warm_prefix", "answering", "settled", "takes_lane_input",
        "last_frame_id", "skipped_checks", "memory_id",
    })

    def __init__(
        self, session_id: str, limits: Limits, capabilities: Capabilities, voice: VoicePaths | None = None,
        source: Source | None = None, *, state: SessionCore | None = None, memory: MemoryPolicy | None = None,
    ) -> None:
        self.state = state or SessionCore(session_id, limits, capabilities, voice)
        self.source = source or Source()
        self.answers_asked = 0  # answer requests read, not yet handled in their lane
        # lane inputs behind the running answer's end: (the client event, what to do then)
        self._waiting: deque[tuple[object, Callable[[Now], list[Effect]]]] = deque()
        self._asked = _Asked([], False)
        self._listening: int | None = None  # where the running transcription starts (a stream sample)
        self._listened = 0  # the stream sample up to which it was fed
        self._job: WarmStep | CheckStep | CaptionStep | None = None  # the engine job running
        self._trims: dict[int, NativeAudioTrim] = {}
        self._timer: float | None = None
        self._warmed_at = self._slid_at = float("-inf")  # the last prefill of the prefix / of the next window started
        self._ending = False  # video.done is handled: the session closes after its last answer
        self._memory = memory  # the server's memory policy; None: it keeps no memory
        self._keyframes: Keyframes | None = None  # set when this session remembers
        self._search: SearchRun | None = None  # the memory search under way
        self._caption_due: float | None = None  # the moment whose caption waits for the engine
        self._caption_stopping = False  # the running caption was stopped for the session's own work
        self.memory_id = session_id  # what its memory is kept under (an earlier session's, continued)

    @classmethod
    def over(cls, state: SessionCore, source: Source | None = None) -> SessionMachine:
        """A machine deciding over an existing ``state`` (a configured ``SessionCore``)."""
        return cls(state.session_id, state.limits, state.capabilities, state.voice, source, state=state)

    def ask(self, answer: Answer, now: Now, received: float | None = None) -> list[Effect]:
        """Ask for an answer planned outside the client's events (``SessionCore.plan_*``: a
        test, or work the session schedules itself): it starts as a client's question would.
        Raises ``no_frames`` when none of its frames is usable."""
        return self._ask(answer, now.s if received is None else received, now)

    # ------------------------------------------------------------------ the documented surface
    @property
    def session_id(self) -> str:
        return self.state.session_id

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def limits(self) -> Limits:
        return self.state.limits

    @property
    def config(self) -> SessionConfig:
        return self.state.config

    @property
    def warm_prefix(self) -> bool:
        """True when this session keeps the engine's prefix warm."""
        return self.state.warm_prefix

    @property
    def answering(self) -> bool:
        """True from a question until its answer's end was handled (or it was withdrawn)."""
        return self.state.slot.answering

    @property
    def settled(self) -> bool:
        """True when no engine job runs or is wanted and nothing waits for an answer's end."""
        state, slot = self.state, self.state.slot
        checks_wanted = self._checks and state.check_due(math.inf) is not None
        return slot.state is SlotState.IDLE and not (self.warm_prefix and slot.behind) and not self._waiting \
            and state.running is None and not checks_wanted

    @property
    def _checks(self) -> bool:
        """True when this session's watches are checked (on a warm prefix, with token probabilities)."""
        return self.warm_prefix and self.state.capabilities.token_probabilities

    @property
    def takes_lane_input(self) -> bool:
        """False while lane inputs wait for the running answer's end: the lane holds the next."""
        return not self._waiting

    @property
    def last_frame_id(self) -> str | int | None:
        return self.state.last_frame_id

    def skipped_checks(self) -> int:
        """Accepted frames no check looked at, told once (``SessionCore.skipped_checks``)."""
        return self.state.skipped_checks()

    # ------------------------------------------------------------------ configuration
    def configure(self, config: SessionConfig, memory_of: str | None = None) -> SessionReady:
        """Apply the first message; returns ``SessionReady``. ``memory_of``: the earlier session
        whose memory this one continues (its client came back with its handle). Raises
        ``invalid_config``."""
        ready = self.state.configure(config)
        self._remembering(config.memory.enabled)
        self.memory_id = memory_of or self.state.session_id
        return ready.model_copy(update={"memory_id": self.memory_id if self._keyframes is not None else None})

    def resumed(self, first: SessionReady) -> SessionReady:
        """Taken back by its client: the ``SessionReady`` to send (its buffered frames, all
        decoded at intake, are warmed again when it opens)."""
        if self.warm_prefix and self.state.buffer.frames:
            self.state.slot.prefix_behind()
        return self.state.resumed(first)

    def close(self) -> None:
        """Release every frame and buffer; the session is over."""
        self.state.close()


    @property
    def _vad(self) -> bool:
        """True when turn detection is on and a voice activity model judges the audio."""
        return self.state.detector is not None and self.state.voice.vad_window is not None

    # ------------------------------------------------------------------ inputs
    def receive(self, item: Input, now: Now) -> list[Effect]:
        """The effects of one input, in order. A bad input gets its error event here; it never raises
        for a client's behaviour."""
        if isinstance(item, Read):
            return self._guarded(item.event, lambda: self._read(item.event))
        if isinstance(item, Handle):
            if self._waiting and not isinstance(item.event, VideoFrame):  # frames never wait for an answer
                self._waiting.append((item.event, lambda later: self._handle(item, later)))
                return []
            return self._guarded(item.event, lambda: self._handle(item, now))
        if isinstance(item, FrameShed):
            ack = self.state.shed_frame(item.event, now.wall_ms)
            return [Tally("shed"), *([Send(ack)] if ack is not None else [])]
        if isinstance(item, Tick):
            self._timer = None
            return self._next_work(now)
        if isinstance(item, Opened):
            return ([ResetVad(True)] if self._vad else []) + self._next_work(now)
        if isinstance(item, Closed):
            if self.state.phase is not Phase.CLOSED:
                self.state.move_to(Phase.CLOSED)
            return []
        raise TypeError(f"not a core input: {type(item).__name__}")

    def completed(self, result: Result, now: Now) -> list[Effect]:
        """The effects of a job's result, in order."""
        handler = self._results.get(type(result))
        if handler is None:
            raise TypeError(f"not a job result: {type(result).__name__}")
        return handler(self, result, now)

    def _guarded(self, event: object, decide: Callable[[], list[Effect]]) -> list[Effect]:
        """``decide()``, or the error event of the ``SessionError`` it raised (naming ``event``)."""
        try:
            return decide()
        except SessionError as exc:
            return [Send(error_event(exc, origin_of(event)))]
        except Refused as refused:
            return [*refused.effects, Send(error_event(refused.error, origin_of(event)))]

    def _read(self, event: object) -> list[Effect]:
        """Control at once: ``ping``, a second ``session.config``, cancels; a new question or
        request stops the running answer now (its lane waits for the end)."""
        if isinstance(event, Ping):
            return [Send(Pong())]
        if isinstance(event, SessionConfig):
            return [Send(error_event(self.state.configured_again()))]
        if isinstance(event, ResponseCancel):
            return self._stop_answer("cancel")
        if isinstance(event, CancelRequest):
            refused = self.state.refuse_cancel(asked=self.answers_asked > 0)
            errors = [Send(error_event(refused, origin_of(event)))] if refused is not None else []
            return errors + self._stop_answer("cancel")
        if isinstance(event, VideoQuery) or (isinstance(event, AnswerRequest) and not event.exclusive):
            self.answers_asked += isinstance(event, AnswerRequest)
            return self._stop_answer("question")
        if isinstance(event, ClearOutputAudio):
            return self._stop_answer("cancel")  # its audio stops with it
        self.answers_asked += isinstance(event, AnswerRequest)
        return []

    def _stop_answer(self, cause: str) -> list[Effect]:
        """Stop the asked or running answer (``cause``: what its ``response.done`` names)."""
        answer = self.state.running
        if answer is None:
            return []
        answer.stop(cause)
        return [Stop(answer)]

    def _handle(self, item: Handle, now: Now) -> list[Effect]:
        event = item.event
        if isinstance(event, VideoFrame):
            self.state.check_frame_size(event)
            receive_ms = now.wall_ms - (now.s - item.received) * 1000  # when it was read, not dequeued
            return [Prepare(event, self.state.image_side(event), item.received, receive_ms)]
        if isinstance(event, AudioChunkIn):
            return self._audio(event)
        if isinstance(event, VideoQuery) and event.range is not None:
            return self._wait_or(event, now, lambda later: self._recall(event, item.received, later))
        if isinstance(event, VideoQuery):
            return self._wait_or(event, now, lambda later: self._query(event, item.received, later))
        if isinstance(event, MemorySearch):
            return self._search_memory(event, now)
        if isinstance(event, MemoryClear):
            return self._forget()
        if isinstance(event, AnswerRequest):
            self.answers_asked -= 1
            running = self.state.running
            self.state.check_request(event, running is not None and not running.stopping)
            if event.range is not None:
                return self._wait_or(event, now, lambda later: self._recall(event, item.received, later))
            return self._wait_or(event, now, lambda later: self._ask(
                self.state.plan_answer(event), item.received, later, origin=origin_of(event)))
        if isinstance(event, VideoDone):  # the running answer finishes first
            return self._wait_or(event, now, lambda later: self._done(), stop=False)
        if isinstance(event, WATCH_EVENTS):
            return [Send(e) for e in self.state.apply_watch(event)] + self._next_work(now)
        if isinstance(event, Command):
            return self._command(event, now)
        raise SessionError(ErrorCode.INVALID_MESSAGE, f"{getattr(event, 'type', '?')} is not handled here")

    def _wait_or(self, event: object, now: Now, go: Callable[[Now], list[Effect]], *, stop: bool = True) -> list[Effect]:
        """``go(now)`` when no answer is asked or running; else wait for its end (stopping it,
        cause ``question``, when ``stop``), and every lane input after this one with it."""
        if self.state.running is None:
            return go(now)
        self._waiting.append((event, go))
        return self._stop_answer("question") if stop else []

    def _done(self) -> list[Effect]:
        """``video.done``, with no answer running: goodbye."""
        self._ending = True
        self.state.move_to(Phase.CLOSING)
        return [Send(SessionDone()), EndSession()]

    def _command(self, command: Command, now: Now) -> list[Effect]:
        """A command that starts no answer (items, audio commits, config updates)."""
        detector = self.state.detector
        effects: list[Effect] = []
        for event in self.state.apply(command):
            if isinstance(event, ErrorReported):  # a refused part of a command that was carried out
                event = event.model_copy(update={"origin": origin_of(command)})
            effects.append(Send(event))
        if self.warm_prefix and self.state.timeline.edited:
            self.state.slot.prefix_behind()  # an item edited the timeline: re-warmed from there
        if self.state.detector is not detector:  # turn detection was switched: fresh audio
            effects.append(ResetVad(self._vad))
        return effects + self._listen() + self._next_work(now)

    # ------------------------------------------------------------------ answers
    def _query(self, event: VideoQuery, received: float, now: Now) -> list[Effect]:
        take = self.state.detector is None and self._take_listening()  # the query takes the buffered audio
        answer = self._plan(lambda: self.state.plan_query(event), take)
        return self._ask(answer, received, now, take_listening=take)

    def _take_listening(self) -> bool:
        """The running transcription goes to the question being planned: True when there is one."""
        take, self._listening = self._listening is not None, None
        return take

    @staticmethod
    def _plan(make: Callable[[], Answer], took_listening: bool) -> Answer:
        """``make()``; when it raises, the transcription the question took is stopped first."""
        try:
            return make()
        except SessionError as exc:
            if took_listening:
                raise Refused(exc, [StopListening()]) from None
            raise

    def _ask(self, answer: Answer, received: float, now: Now, *, before: list[Effect] | None = None,
             origin: Origin | None = None, take_listening: bool = False) -> list[Effect]:
        """Ask for a planned answer: its undecodable frames dropped, a running prefill or round
        of checks stopped (it starts when that one has ended), else started now."""
        stop_job = self.state.ask(answer, received)
        try:
            self.state.settle_frames(answer)
        except SessionError:
            self.state.withdraw(answer)
            raise
        answer.asked_by = origin
        self._asked = _Asked(before or [], take_listening)
        if stop_job:
            return [Stop(self._job)] if self._job is not None else []
        return self._start(now)

    def _start(self, now: Now) -> list[Effect]:
        """The asked answer starts (nothing else runs on the engine now)."""
        answer = self.state.running
        assert answer is not None
        transcribe = self.state.needs_transcription(answer)
        prompt = None if transcribe else self.state.query_prompt(answer)
        speak = "audio" in answer.modalities and self.state.voice.speaks
        if "audio" in answer.modalities and not speak:
            self._trims[id(answer)] = NativeAudioTrim(self.source.native_trim_ms)
        asked, self._asked = self._asked, _Asked([], False)
        return [*asked.before, *(Send(e) for e in self.state.slot.start()),
                StartAnswer(answer, prompt, transcribe=transcribe, take_listening=asked.take_listening, speak=speak)]

    def _transcribed(self, result: Transcribed, now: Now) -> list[Effect]:
        answer = result.answer
        event = answer.transcribed(result.transcript)
        kept = self._keep_note("transcript", now, result.transcript)
        return [Send(event), *kept, Generate(answer, self.state.query_prompt(answer))]

    def _generated(self, result: Generated, now: Now) -> list[Effect]:
        answer, out = result.answer, result.output
        effects: list[Effect] = [Send(e) for e in answer.output(out, now.s)]
        if isinstance(out, TextDelta) and "audio" in answer.modalities and self.state.voice.speaks:
            effects.append(Speak(answer, out.text))
        elif isinstance(out, AudioChunk) and id(answer) in self._trims:
            wav = self._trims[id(answer)].apply(out.wav)
            if wav:  # the engine's own voice: passed on, never re-synthesized
                effects += [Send(e) for e in answer.audio_out(wav, now.s)]
        return effects

    def _spoken(self, result: Spoken, now: Now) -> list[Effect]:
        return [Send(e) for e in result.answer.audio_out(result.wav, now.s, result.words)]

    def _ended(self, result: Ended, now: Now) -> list[Effect]:
        """The answer's end: its closing events, then what waited for it, then the engine's next job."""
        self._trims.pop(id(result.answer), None)
        effects: list[Effect] = [Send(e) for e in self.state.end_answer(result.answer, result.outcome, now.s,
                                                                        result.error_code)]
        effects += self._keep_answer(result.answer, now)
        while self._waiting and self.state.running is None and not self._ending:
            event, go = self._waiting.popleft()
            effects += self._guarded(event, lambda go=go: go(now))
        return effects + self._next_work(now)

    # ------------------------------------------------------------------ frames
    def _prepared(self, result: Prepared, now: Now) -> list[Effect]:
        intake = self.state.take_frame(result.event, result.frame, result.receive_ms, now.wall_ms)
        effects: list[Effect] = [Tally("accepted" if intake.frame is not None else "filtered"),
                                 Tally("evicted", len(intake.evicted))]
        if intake.ack is not None:
            effects.append(Send(intake.ack))
        if intake.frame is not None:
            effects += self._keep_frame(result.event, result.frame, intake.frame.receive_ts_ms)
        return effects + self._next_work(now)

    _results: dict[type, Callable[[SessionMachine, object, Now], list[Effect]]] = {
        Prepared: _prepared,
        Warmed: EngineJobs._warmed,
        Checked: EngineJobs._checked,
        Transcribed: _transcribed,
        Generated: _generated,
        Spoken: _spoken,
        Ended: _ended,
        SpeechDetected: SpeechDecisions._speech,
        HeldTranscribed: SpeechDecisions._held,
        Recalled: MemoryDecisions._recalled,
        MemoryFound: MemoryDecisions._memory_found,
        MomentsLoaded: MemoryDecisions._moments_loaded,
        MemoryForgotten: MemoryDecisions._forgotten,
        Captioned: MemoryDecisions._captioned,
    }
