"""One WebSocket session: the adapter between a transport, the core and an engine.

All of a session's work runs in one task group: the reader, the processor, frame decodes,
the prefix warmup and the running answer. When the session ends, the group is cancelled
and awaited, so nothing it started outlives it.

What runs on the engine (a prefill, an answer, both while one stops the other) is one state,
``turns`` (``lifecycle.py``), moved by its transition table; every wait is a wait on that
state. An answer's events come from its ``Answer``, which makes exactly one end per start.

Control comes before media: the reader answers ``ping`` and interrupts a running answer
(``response.cancel``, ``video.query``) the moment it reads them; frames, audio, queries and
``video.done`` then go in order through a bounded queue to the processor, so a question
always sees the frames sent before it.

Intake is bounded in bytes and sheds load (``intake.py``): a frame that does not fit the
session's or the server's read-ahead budget, or finds the queue full, or cannot start
decoding within ``intake_max_wait_ms`` of being read, is acked at once with
``reason: "overloaded"`` instead of waiting. Every frame with a ``frame_id`` gets an ack,
and a session whose messages are still waiting is never closed as idle.

Voice: with server turn detection the processor runs each audio chunk through the voice
activity model; speech that starts interrupts the running answer (barge-in), speech that
stops starts an answer (``interrupt_response`` / ``create_response`` false: the answer goes
on / the spoken turn is kept, transcribed, for the next answer: ``_hold_spoken``). An answer first transcribes its audio when the engine cannot hear,
and speaks its text sentence by sentence when the engine cannot speak (``speech.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import anyio
from anyio.abc import TaskGroup

from handlers.session import log_context
from server import blocking
from handlers.wire.codec import CloseConnection, V1Codec, WireCodec
from handlers.wire.commands import AnswerRequest, CancelRequest, ClearOutputAudio, Command
from handlers.core.answer import Answer, Outcome
from handlers.core.microphone import SpokenQuestion
from handlers.core.negotiation import Limits, VoicePaths, opening_config
from handlers.core.session_core import Phase, SessionCore
from handlers.wire.errors import CLOSE_CODES, ErrorCode, Origin, SessionError
from handlers.media.preparation import decode_prepared, prepare_frame
from handlers.session.intake import Admission, IntakeLimits, ReadAhead
from handlers.core.lifecycle import Turns, TurnState
from handlers.core.rate_limit import ControlBudget, ControlLimits, Verdict
from handlers.session.observer import SessionObserver
from handlers.session.resume import ParkedSession, ParkingLot
from handlers.wire.protocol import (
    AudioChunkIn,
    ErrorEvent,
    Ping,
    Pong,
    ResponseCancel,
    ServerEvent,
    SessionClosing,
    SessionConfig,
    SessionDone,
    SessionReady,
    VideoDone,
    VideoFrame,
    VideoQuery,
    WatchCreate,
    WatchDelete,
    WatchUpdate,
    origin_of,
)
from handlers.session.voice import Listening, NativeAudioTrim, SpokenAnswer
from handlers.session.transport import Disconnected, Transport
from handlers.core.turn_detection import SpeechStarted, SpeechStopped
from server.engines.base import AudioChunk, Capabilities, Engine, EngineError, TextDelta
from server.speech.base import SpeechError, VadStream, Voice

log = logging.getLogger("livesight.session")

#: Client events that are media: bounded by bytes and shed under load, not rate-limited.
MEDIA = (VideoFrame, AudioChunkIn)
WATCH_EVENTS = (WatchCreate, WatchUpdate, WatchDelete)
#: Client events that start or stop an answer: they also take from the answer budget.
ANSWER_MOVES = (VideoQuery, AnswerRequest, ResponseCancel, CancelRequest, ClearOutputAudio)


def now_ms() -> float:
    return time.time() * 1000.0


class _SessionOver(Exception):
    """Raised inside the session to end it after a closing error or ``video.done``."""


@dataclass
class Turn:
    """What the adapter holds of the running answer besides the answer itself (``Answer``,
    timed from when the question was read or speech stopped, on ``time.perf_counter``): the
    cancel scope that stops it and the event set once its end was sent."""

    answer: Answer
    scope: anyio.CancelScope
    done: anyio.Event
    listening: Listening | None = None  # the question's audio, transcribed as it was spoken
    before: list[ServerEvent] = field(default_factory=list)  # sent before its response.start (watch.fired)
    origin: Origin | None = None  # the client event that asked for it (its errors name that event)


def voice_paths(capabilities: Capabilities, voice: Voice | None) -> VoicePaths:
    """What the engine does itself and what the voice stages add: native first, never both."""
    voice = voice or Voice()
    synth, asr = voice.synthesizer, voice.transcriber
    return VoicePaths(
        output="native" if capabilities.audio_output else (synth.name if synth else None),
        input="native" if capabilities.audio_input else (asr.name if asr else None),
        vad_window=voice.vad.window_samples if voice.vad else None,
        default_voice=None if capabilities.audio_output or synth is None else synth.default_voice,
        knows_voice=synth.knows_voice if synth and not capabilities.audio_output else (lambda v: True),
    )


class Session:
    """Runs one client connection from its first message to its end."""

    def __init__(
        self, transport: Transport, engine: Engine, limits: Limits, config_timeout_s: float, voice: Voice | None = None,
        codec: WireCodec | None = None,
        *, intake: IntakeLimits | None = None, read_ahead: ReadAhead | None = None, admission: Admission | None = None,
        observer: SessionObserver | None = None, parking: ParkingLot | None = None, owner: str = "",
        control: ControlLimits | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.intake = intake or IntakeLimits()
        self.server_read_ahead = read_ahead or ReadAhead(self.intake.max_read_ahead_bytes)
        self.admission = admission or Admission(max_sessions=1 << 30, max_pending=1 << 30)
        self.read_ahead_bytes = 0  # this session's bytes read but not yet handled
        self.waiting_messages = 0  # read, not yet handled: the session is not idle while > 0
        self.frames_unacked = 0  # frames among them (counted for the whole server by ``blocking``)
        self.frames_read = 0  # frames queued to the frame lane, and handled there: a turn waits
        self.frames_handled = 0  # until the frames read before it are handled
        self.answers_asked = 0  # answer requests read, not yet handled by the turn lane
        self.control = ControlBudget(control or ControlLimits())
        self.observer = observer or SessionObserver()
        self.transport = transport
        self.codec = codec or V1Codec()  # the wire protocol: messages <-> core events
        self.engine = engine
        self.voice = voice or Voice()
        self.core = SessionCore(self.id, limits, engine.capabilities, voice_paths(engine.capabilities, voice))
        self._vad_stream: VadStream | None = None
        self._listening: Listening | None = None
        self.config_timeout_s = config_timeout_s
        self._send_lock = asyncio.Lock()  # anyio's costs ~40 us a frame on the event loop
        self._changed = anyio.Event()  # set, and replaced, on every change of ``turns``
        self.core.turns.on_change = self._wake
        self.turn: Turn | None = None  # the asked or running answer's handles (``turns.answer``'s)
        self._warm_scope: anyio.CancelScope | None = None  # the running prefill's, to stop it
        self._tg: TaskGroup | None = None
        self.closed = False
        self.close_code = 1000
        self.ended = anyio.Event()
        self.parking, self.owner = parking, owner  # resume: where a dropped session waits; its key's digest
        self._resume_token: str | None = None
        self._ready: SessionReady | None = None
        self._dropped = False

    @property
    def turns(self) -> Turns:
        """What runs on the engine (the core's): every wait of the session is on it."""
        return self.core.turns

    @property
    def settled(self) -> bool:
        """True when no decode, warmup or answer is running or wanted (benchmarks wait for it)."""
        behind = self.core.warm_prefix and self.turns.behind
        return not self.waiting_messages and self.turns.state is TurnState.IDLE and not behind

    def _wake(self) -> None:
        """``turns`` changed: wake whoever waits on it."""
        self._changed.set()
        self._changed = anyio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` (a question about ``turns``) is true."""
        while not ready():
            await self._changed.wait()

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve the connection until it ends; never raises for client behaviour."""
        context = log_context.session_id.set(self.id)
        self.observer.opened()
        try:
            if not await self._configure():
                return
            frames_in, frames_out = anyio.create_memory_object_stream[object](self.core.limits.max_queue)
            turns_in, turns_out = anyio.create_memory_object_stream[object](self.core.limits.max_queue)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._pick_up(tg)
                tg.start_soon(self._read, frames_in, turns_in)
                tg.start_soon(self._take_frames, frames_out)
                tg.start_soon(self._take_turns, turns_out)
                tg.start_soon(self._idle_loop)
                if self.core.warm_prefix:
                    tg.start_soon(self._warm_loop)
                elif self.core.config.prefix_warmup:
                    log.info("session %s: no prefix warmup, engine %r cannot keep a prefix",
                             self.id[:8], self.engine.capabilities.name)
        except* Disconnected as gone:  # the client left (or an idle/closing error was sent)
            self._dropped = gone.subgroup(lambda e: isinstance(e, Disconnected) and e.code == 1000) is None
        finally:
            with anyio.CancelScope(shield=True):
                self.admission.release(self.id)
                self.server_read_ahead.give(self.read_ahead_bytes)
                self.read_ahead_bytes = 0
                blocking.frame_done(self.frames_unacked)  # frames still queued: no longer waiting
                self.frames_unacked = 0
                if self._parkable():
                    await self.parking.park(self._resume_token, ParkedSession(self.id, self.core, self.owner, self._ready))
                else:
                    self.core.close()
                    await self.engine.release(self.id)
                await self.transport.close(self.close_code)
                self.closed = True
                self.observer.checks(0, self.core.skipped_checks())  # frames no round looked at before the end
                self.observer.closed()
                self.ended.set()
                log_context.session_id.reset(context)

    async def drain(self, timeout_s: float) -> None:
        """Server shutdown: send ``session.closing``, let the running answer (and any that the
        client still starts) finish for at most ``timeout_s``, then close with 1012."""
        self.close_code = 1012
        try:
            await self.send(SessionClosing(deadline_ms=round(timeout_s * 1000)))
        except Disconnected:
            pass
        with anyio.move_on_after(timeout_s):
            await self._until(lambda: self.turn is None)  # its end sent
        if self._tg is not None:
            self._tg.cancel_scope.cancel()  # run() closes the transport with close_code
        else:
            await self.transport.close(self.close_code)  # still awaiting session.config
        await self.ended.wait()

    async def _configure(self) -> bool:
        """Wait for ``session.config`` (or take the codec's opening one); returns False when
        the session must close."""
        raw: str | bytes | None = None
        events = self.codec.opening()
        try:
            if not events:
                with anyio.fail_after(self.config_timeout_s), self.admission.waiting(self.id):
                    raw = await self.transport.receive()
        except TimeoutError:
            await self._fail(SessionError(ErrorCode.CONFIG_TIMEOUT, f"no session.config within {self.config_timeout_s:g} s"))
            return False
        if raw is None and not events and self.admission.was_pushed_out(self.id):
            await self._fail(SessionError(
                ErrorCode.TOO_MANY_SESSIONS, "too many connections are waiting for session.config; this one waited longest"
            ))
            return False
        try:
            event = opening_config(lambda: events or self.codec.decode(raw))
        except SessionError as exc:
            await self._fail(exc)
            return False
        if not self.admission.claim(self.id):
            await self._fail(SessionError(
                ErrorCode.TOO_MANY_SESSIONS, f"the server is at its limit of {self.admission.max_sessions} sessions"
            ))
            return False
        async with self.admission.setting_up():
            try:
                await self._start(event)
            except SessionError as exc:  # a config the core refuses (its watches): invalid_config
                await self._fail(exc)
                return False
        if self.core.detector is not None and self.voice.vad is not None:
            self._vad_stream = self.voice.vad.open_stream()
        return True

    async def _start(self, config: SessionConfig) -> None:
        """Configure a new session, or take back the parked one whose token the config carries;
        sends ``session.ready`` (with a fresh resume token when resume is on)."""
        parked = None
        if config.resume_token and self.parking is not None:
            try:
                parked = self.parking.claim(config.resume_token, self.owner)
            except SessionError as exc:
                await self.report(exc)  # then a new session with this config
        if parked is not None:
            self.id, self.core = parked.session_id, parked.core
            self.core.turns.on_change = self._wake
            log_context.session_id.set(self.id)
            ready = self.core.resumed(parked.ready)
            log.info("session resumed at frame %r", self.core.last_frame_id)
        else:
            ready = self.core.configure(config)
        self._ready = ready.model_copy(update={"resumed": False, "last_frame_id": None})
        if self.parking is not None:
            self._resume_token = self.parking.new_token()
            ready = ready.model_copy(update={"resume_token": self._resume_token})
        await self.send(ready)

    def _pick_up(self, tg: TaskGroup) -> None:
        """A resumed session: re-warm its buffer (every buffered frame was decoded at intake)."""
        if self.core.warm_prefix and self.core.buffer.frames:
            self.turns.prefix_behind()

    def _parkable(self) -> bool:
        """True when the connection dropped from a ready session that can be resumed."""
        return (
            self.parking is not None and self._resume_token is not None and self._ready is not None
            and self._dropped and self.core.phase is Phase.READY and self.close_code == 1000
        )

    async def _fail(self, exc: SessionError) -> None:
        """Send a closing error and close."""
        await self.report(exc)
        self.core.move_to(Phase.CLOSED)
        await self.transport.close(CLOSE_CODES.get(exc.code, 1008))

    # ------------------------------------------------------------------ errors and sending
    async def send(self, event: ServerEvent) -> None:
        async with self._send_lock:
            try:
                texts = self.codec.encode(event)
            except CloseConnection as close:  # a protocol whose only answer to this is a close
                self.observer.sent(event)  # counted as sent: the close says it
                await self._close_for(close)
            for text in texts:
                await self.transport.send(text)
        self.observer.sent(event)

    async def _close_for(self, close: CloseConnection) -> None:
        """Close with the codec's code and reason; the session ends for good (it is not parked)."""
        log.info("closing: %s (%d)", close.reason, close.code)
        self.close_code = close.code
        if self.core.phase is not Phase.CLOSED:
            self.core.move_to(Phase.CLOSED)
        await self.transport.close(close.code, close.reason)
        raise Disconnected(close.code)

    async def _send_all(self, events: list[ServerEvent]) -> None:
        for event in events:
            await self.send(event)

    async def report(self, exc: SessionError, origin: Origin | None = None) -> None:
        """The one place a ``SessionError`` becomes an ``error`` event (``origin``: the client
        event it answers, when the error does not name one itself)."""
        await self.send(
            ErrorEvent(
                code=exc.code.value, message=exc.message, frame_id=exc.frame_id, closes_session=exc.closes_session,
                retry_after_ms=exc.retry_after_ms, origin=exc.origin or origin, wire_code=exc.wire_code,
            )
        )

    # ------------------------------------------------------------------ reader
    async def _read(
        self, frames: anyio.abc.ObjectSendStream[object], turns: anyio.abc.ObjectSendStream[object]
    ) -> None:
        """Read messages: answer control at once (within the session's control budget), queue
        frames to the frame lane and everything else to the turn lane. Each message is one
        turn of the event loop at most: the reader yields after every message, so a session
        with a backlog of buffered messages cannot hold the loop from the others."""
        async with frames, turns:
            while True:
                raw = await self._receive_or_idle()
                await anyio.lowlevel.checkpoint()
                try:
                    events = self.codec.decode(raw)
                except SessionError as exc:
                    if await self._within_budget(False):
                        await self.report(exc)
                    continue
                if not all(isinstance(e, MEDIA) for e in events):
                    moves = any(isinstance(e, ANSWER_MOVES) for e in events)
                    if not await self._within_budget(moves, origin_of(events[0]) if events else None):
                        continue
                for event in events:
                    self.observer.received(event)
                    if isinstance(event, Ping):
                        await self.send(Pong())
                    elif isinstance(event, ResponseCancel):
                        self._stop_answer("cancel")
                    elif isinstance(event, CancelRequest):
                        refused = self.core.refuse_cancel(asked=self.answers_asked > 0)
                        if refused is not None:
                            await self.report(refused, origin_of(event))
                        self._stop_answer("cancel")
                    elif isinstance(event, SessionConfig):
                        await self.report(self.core.configured_again())
                    elif isinstance(event, VideoFrame):
                        await self._read_frame(frames, event)
                    else:
                        if isinstance(event, VideoQuery) or (isinstance(event, AnswerRequest) and not event.exclusive):
                            self._stop_answer("question")
                        elif isinstance(event, ClearOutputAudio):
                            self._stop_answer("cancel")  # its audio stops with it
                        self.answers_asked += isinstance(event, AnswerRequest)
                        self.waiting_messages += 1
                        await turns.send((event, time.perf_counter(), self.frames_read))
                        if isinstance(event, VideoDone):
                            return

    async def _within_budget(self, moves_answer: bool, origin: Origin | None = None) -> bool:
        """Take one control message from the session's budget (``rate_limit.py``): False when
        it is refused (the client is told once, naming the message dropped: ``origin``; a
        client that keeps flooding is closed)."""
        verdict = self.control.check(time.monotonic(), moves_answer)
        if verdict is Verdict.TAKE:
            return True
        self.observer.refused()
        await self._refuse(verdict, origin)
        # Read nothing more from this client until a token is back: its flood waits in the
        # socket (TCP pushes back) instead of costing the server a parse per message.
        await anyio.sleep(self.control.wait_s(moves_answer))
        return False

    async def _refuse(self, verdict: Verdict, origin: Origin | None = None) -> None:
        """Tell the client once, or close it when it has flooded too long (``ControlBudget.refusal``)."""
        refusal = self.control.refusal(verdict)
        if refusal is None:
            return
        if verdict is Verdict.CLOSE:
            await self._fail(refusal)
            raise Disconnected(1008)
        await self.report(refusal, origin)

    def _stop_answer(self, cause: str) -> None:
        """Stop the running answer without waiting for it (the reader must keep reading);
        its task sends its end, and the turn lane waits for that before the next answer.
        ``cause``: cancel, question or speech (its ``response.done`` says which)."""
        turn = self.turn
        if turn is not None:
            turn.answer.stop(cause)
            turn.scope.cancel()

    async def _read_frame(self, queue: anyio.abc.ObjectSendStream[object], event: VideoFrame) -> None:
        """Queue a frame within the byte budgets, or shed it with an ``overloaded`` ack."""
        size = len(event.data)
        if self.read_ahead_bytes + size <= self.intake.max_read_ahead_bytes and self.server_read_ahead.take(size):
            try:
                queue.send_nowait((event, time.perf_counter(), size))
            except anyio.WouldBlock:
                self.server_read_ahead.give(size)
            else:
                self.read_ahead_bytes += size
                self.waiting_messages += 1
                self.frames_unacked += 1
                self.frames_read += 1
                blocking.frame_read()
                return
        await self._shed(event)

    async def _shed(self, event: VideoFrame) -> None:
        ack = self.core.shed_frame(event, now_ms())
        self.observer.frames("shed")
        if ack is not None:
            await self.send(ack)

    async def _receive_or_idle(self) -> str | bytes:
        """Next message; raises the idle timeout when nothing came and nothing is running."""
        while True:
            with anyio.move_on_after(self.core.limits.idle_timeout_s):
                return await self.transport.receive()
            if not self.turns.answering and not self.waiting_messages:
                await self._fail(
                    SessionError(ErrorCode.IDLE_TIMEOUT, f"nothing received for {self.core.limits.idle_timeout_s:g} s")
                )
                raise Disconnected

    # ------------------------------------------------------------------ frame lane
    async def _take_frames(self, queue: anyio.abc.ObjectReceiveStream[object]) -> None:
        """Check, filter and ack frames in the order read, never waiting for an answer."""
        async with queue:
            async for event, received, size in queue:
                try:
                    await self._on_frame(event, received)
                except SessionError as exc:
                    await self.report(exc, origin_of(event))
                finally:
                    self.waiting_messages -= 1
                    self.read_ahead_bytes -= size
                    self.server_read_ahead.give(size)
                    self.frames_unacked -= 1
                    blocking.frame_done()
                    self.frames_handled += 1
                    self._wake()

    async def _on_frame(self, event: VideoFrame, received: float) -> None:
        """Prepare off the loop (taking turns with other sessions), then let the core filter,
        buffer and ack it."""
        self.core.check_frame_size(event)
        receive_ms = now_ms() - (time.perf_counter() - received) * 1000  # when it was read, not dequeued
        side = self.core.image_side(event)
        deadline = received + self.intake.intake_max_wait_ms / 1000
        try:
            prepared = await blocking.run_fair(
                prepare_frame, event.data, event.frame_id, self.intake, side, deadline=deadline
            )
            if prepared.image is None:
                prepared = await blocking.run_fair(
                    decode_prepared, prepared, event.frame_id, self.intake, side, deadline=deadline, heavy=True
                )
        except blocking.Overloaded:
            await self._shed(event)
            return
        intake = self.core.take_frame(event, prepared, receive_ms, now_ms())  # the prefix behind, a check due
        if intake.frame is not None:
            self._wake()  # the warm loop looks again
        self.observer.frames("accepted" if intake.frame is not None else "filtered")
        self.observer.frames("evicted", len(intake.evicted))
        if intake.ack is not None:
            await self.send(intake.ack)

    # ------------------------------------------------------------------ turn lane
    async def _take_turns(self, queue: anyio.abc.ObjectReceiveStream[object]) -> None:
        """Audio, questions, commands and ``video.done`` in the order read; each first waits
        until the frame lane has handled every frame read before it (so a question sees them),
        while frames read after it go on being acked."""
        async with queue:
            async for event, received, frames_before in queue:
                try:
                    await self._until(lambda: self.frames_handled >= frames_before)
                    if isinstance(event, AudioChunkIn):
                        await self._on_audio(event)
                    elif isinstance(event, VideoQuery):
                        await self._on_query(event, received)
                    elif isinstance(event, VideoDone):
                        await self._on_done()
                        return
                    elif isinstance(event, AnswerRequest):
                        self.answers_asked -= 1
                        running = self.turn is not None and not self.turn.answer.stopping  # a stopped one is ending
                        self.core.check_request(event, running)
                        await self.interrupt("question")
                        await self._start_turn(self.core.plan_answer(event), received, origin=origin_of(event))
                    elif isinstance(event, WATCH_EVENTS):
                        await self._send_all(self.core.apply_watch(event))
                        self._wake()
                    elif isinstance(event, Command):
                        await self._on_command(event)
                except SessionError as exc:
                    await self.report(exc, origin_of(event))
                finally:
                    self.waiting_messages -= 1

    # ------------------------------------------------------------------ microphone
    async def _on_audio(self, event: AudioChunkIn) -> None:
        """Buffer microphone audio; with turn detection, act on speech starting and stopping.
        Audio a question will take is transcribed as it arrives (``_listen``)."""
        try:
            pcm = self.core.add_audio(event.data)
        finally:
            await self._listen()
        if self._vad_stream is None or self.voice.vad is None:
            return
        try:
            probabilities = await self.voice.vad.probabilities(self._vad_stream, pcm)
        except SpeechError as exc:
            log.warning("voice activity detection failed: %s", exc)
            raise SessionError(ErrorCode.INTERNAL_ERROR, "turn detection failed on this audio") from None
        for decision in self.core.detect_turns(probabilities):
            if isinstance(decision, SpeechStarted):
                await self.send(self.core.turn_event(decision))
                if self.core.speech_interrupts:
                    await self.interrupt("speech")  # barge-in: the speaker talks over the answer
            elif isinstance(decision, SpeechStopped):
                await self.send(self.core.turn_event(decision))
            elif isinstance(decision, SpokenQuestion) and not self.core.answers_speech(self.turn is not None):
                await self._hold_spoken(decision)
            elif isinstance(decision, SpokenQuestion):
                await self.interrupt("question")
                listening, self._listening = self._listening, None
                answer = await self._plan(partial(self.core.plan_spoken_query, decision), listening)
                await self._start_turn(answer, time.perf_counter(), listening)
        await self._listen()  # speech that started in this chunk

    async def _hold_spoken(self, question: SpokenQuestion) -> None:
        """A spoken question that starts no answer waits as an input of the next one; when the
        engine cannot hear, its words are recognised now (``InputTranscribed``). Raises
        ``audio_overflow`` or ``transcription_failed`` (the input then keeps its audio)."""
        listening, self._listening = self._listening, None
        try:
            item = self.core.hold_spoken_question(question)
        except SessionError:
            with anyio.CancelScope(shield=True):
                if listening is not None:
                    await listening.cancel()
            raise
        if not (self.core.voice.transcribes and self.core.config.use_audio_in_video) or self.voice.transcriber is None:
            if listening is not None:
                await listening.cancel()
            return  # the engine hears it with the answer (or it is not used)
        pcm = item.pcm16
        if listening is None:
            listening = Listening(self.voice.transcriber.open_stream(), 0, len(pcm) + 2)
            await self._tg.start(listening.run)
        seen = (listening.fed - listening.start) * 2
        listening.add(pcm[seen:], listening.start + len(pcm) // 2, bounded=False)
        try:
            transcript = await listening.finish()
        except SpeechError as exc:
            log.warning("transcription failed for spoken item %s: %s", item.item_id, exc)
            raise SessionError(ErrorCode.TRANSCRIPTION_FAILED, "the spoken question could not be transcribed") from None
        event = self.core.transcribed_input(item.item_id, transcript)
        if event is not None:
            await self.send(event)

    async def _listen(self) -> None:
        """Hand the audio a question will take to a running transcription (started when such
        audio begins; stopped when it was dropped or the question went elsewhere)."""
        start = self.core.listen_start()
        listening = self._listening
        if listening is not None and listening.start != start:
            self._listening = None
            await listening.cancel()
            listening = None
        if start is None or self.voice.transcriber is None:
            return
        if self.core.detector is None and self.codec.commits_audio:
            return  # the buffer waits for a commit; a streamed transcription would be cut there
        if listening is None:
            listening = Listening(self.voice.transcriber.open_stream(), start, self.core.limits.max_audio_bytes)
            await self._tg.start(listening.run)
            self._listening = listening
        listening.add(self.core.mic.since(listening.fed), self.core.mic.total)

    async def _on_command(self, command: Command) -> None:
        """A core command from a codec (items, audio commits, config updates)."""
        detector = self.core.detector
        for event in self.core.apply(command):
            if isinstance(event, ErrorEvent):  # a refused part of a command that was carried out
                event = event.model_copy(update={"origin": origin_of(command)})
            await self.send(event)
        if self.core.warm_prefix and self.core.timeline.edited:
            self.turns.prefix_behind()  # an item edited the timeline: the prefix is re-warmed from there
        if self.core.detector is not detector:  # turn detection was switched: fresh audio
            vad = self.voice.vad
            self._vad_stream = vad.open_stream() if self.core.detector is not None and vad is not None else None
        await self._listen()  # audio committed or cleared: its running transcription stops

    # ------------------------------------------------------------------ answers
    async def _on_query(self, event: VideoQuery, received: float) -> None:
        await self.interrupt("question")  # a turn may have started between reader and processor
        listening = None
        if self.core.detector is None:  # the query takes the buffered audio, and its transcription
            listening, self._listening = self._listening, None
        await self._start_turn(await self._plan(partial(self.core.plan_query, event), listening), received, listening)

    async def _plan(self, make_plan: Callable[[], Answer], listening: Listening | None) -> Answer:
        """``make_plan()``; when it raises, the question's transcription is stopped first."""
        try:
            return make_plan()
        except BaseException:
            with anyio.CancelScope(shield=True):
                if listening is not None:
                    await listening.cancel()
            raise

    async def _start_turn(
        self, answer: Answer, received: float, listening: Listening | None = None, before: list[ServerEvent] | None = None,
        origin: Origin | None = None,
    ) -> None:
        """Ask for the answer, drop its undecodable frames, wait for a running prefill to
        stop, then start the answer task (``before``: events it sends before its start).
        The caller has interrupted the previous answer."""
        turn = Turn(answer, anyio.CancelScope(), anyio.Event(), listening=listening, before=before or [], origin=origin)
        stop_prefill = self.core.ask(answer, received)  # from here on no prefill starts
        self.turn = turn
        try:
            self.core.settle_frames(answer)
            if stop_prefill and self._warm_scope is not None:
                self._warm_scope.cancel()
            await self._until(lambda: self.turns.may_generate)
        except BaseException:
            with anyio.CancelScope(shield=True):
                if listening is not None:
                    await listening.cancel()
            self.core.withdraw(answer)
            self.turn = None
            turn.done.set()
            raise
        self._tg.start_soon(self._answer, turn)

    async def interrupt(self, cause: str) -> None:
        """Cancel the running answer, if any (``cause``: see ``_stop_answer``), and wait until
        it has ended."""
        turn = self.turn
        if turn is not None:
            self._stop_answer(cause)
            await turn.done.wait()

    async def _answer(self, turn: Turn) -> None:
        """Run one answer: its events come from ``turn.answer`` (exactly one end per start)."""
        answer = turn.answer
        log_context.request_id.set(answer.request_id)  # this task's own context: log lines name the answer
        outcome = Outcome.INTERRUPTED
        error_code: str | None = None
        spoken: SpokenAnswer | None = None
        try:
            await self._send_all([*turn.before, *self.turns.start()])
            with turn.scope:
                if self.core.needs_transcription(answer):
                    await self._transcribe(turn)
                spoken = await self._start_speech(turn)
                trim = NativeAudioTrim(self.voice.native_trim_ms)
                wants_audio = "audio" in answer.modalities
                prompt = self.core.query_prompt(answer)
                stream = self.engine.generate(self.id, answer.request_id, prompt, answer.sampling)
                try:
                    async for out in stream:
                        await self._send_all(answer.output(out, time.perf_counter()))
                        if isinstance(out, TextDelta) and spoken is not None:
                            await spoken.add_text(out.text)
                        elif isinstance(out, AudioChunk):
                            wav = trim.apply(out.wav) if wants_audio and spoken is None else b""
                            if wav:  # the engine's own voice: passed on, never re-synthesized
                                await self._send_audio(turn, wav)
                finally:
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()  # aborts the engine request if it is still running
                if spoken is not None:
                    await spoken.finish()
                if answer.finished is not None:
                    outcome = Outcome.COMPLETED
        except SessionError as exc:
            outcome, error_code = Outcome.FAILED, exc.code.value
            await self.report(exc, turn.origin)
        except EngineError as exc:
            log.warning("engine failed request %s: %s", answer.request_id, exc)
            outcome, error_code = Outcome.FAILED, ErrorCode.ENGINE_ERROR.value
            await self.report(SessionError(ErrorCode.ENGINE_ERROR, "the engine failed to answer"), turn.origin)
        except Disconnected:
            raise
        except Exception:
            log.exception("bug while answering %s", answer.request_id)
            outcome, error_code = Outcome.FAILED, ErrorCode.INTERNAL_ERROR.value
            await self.report(SessionError(ErrorCode.INTERNAL_ERROR, "internal error while answering"), turn.origin)
        finally:
            with anyio.CancelScope(shield=True):
                if spoken is not None:
                    await spoken.cancel()  # nothing of this answer is spoken after its response.done
                if turn.listening is not None:
                    await turn.listening.cancel()  # an interrupted transcription stops at once
                ending = self.core.end_answer(answer, outcome, time.perf_counter(), error_code)
                try:
                    await self._send_all(ending)
                except Disconnected:
                    pass  # the client left; the session is ending anyway
                self.turn = None
                self._wake()  # its end was sent: video.done and drain wait for it; the idle timeout may count
                turn.done.set()

    async def _transcribe(self, turn: Turn) -> None:
        """Turn the answer's audio into its question; sends ``input_audio.transcript``.
        The transcription that ran while the question was spoken is finished with the audio
        it has not seen (``audio_data``, or all of it). Raises ``transcription_failed``."""
        answer = turn.answer
        assert answer.audio is not None and self.voice.transcriber is not None
        pcm = answer.audio.pcm16
        listening = turn.listening
        if listening is None:
            listening = turn.listening = Listening(self.voice.transcriber.open_stream(), 0, len(pcm) + 2)
            await self._tg.start(listening.run)
        seen = (listening.fed - listening.start) * 2
        listening.add(pcm[seen:], listening.start + len(pcm) // 2, bounded=False)
        try:
            transcript = await listening.finish()
        except SpeechError as exc:
            log.warning("transcription failed for %s: %s", answer.request_id, exc)
            raise SessionError(ErrorCode.TRANSCRIPTION_FAILED, "the spoken question could not be transcribed") from None
        await self.send(answer.transcribed(transcript))

    async def _start_speech(self, turn: Turn) -> SpokenAnswer | None:
        """A running speaker for this answer when the session wants audio the engine cannot make."""
        config = self.core.config
        synthesizer = self.voice.synthesizer
        if "audio" not in turn.answer.modalities or not self.core.voice.speaks or synthesizer is None:
            return None
        spoken = SpokenAnswer(
            synthesizer, config.voice or synthesizer.default_voice, config.speech_rate,
            max_sentence_chars=self.voice.max_sentence_chars,
            max_pending_sentences=self.voice.max_pending_sentences,
            pause_ms=self.voice.sentence_pause_ms,
            deliver=partial(self._send_audio, turn),
            report=self.report,
        )
        await self._tg.start(spoken.run)
        return spoken

    async def _send_audio(self, turn: Turn, wav: bytes, words: str = "") -> None:
        await self._send_all(turn.answer.audio_out(wav, time.perf_counter(), words))

    async def _on_done(self) -> None:
        """``video.done``: let the running answer finish, then say goodbye."""
        await self._until(lambda: self.turn is None)  # its end sent
        await self.send(SessionDone())
        self.core.move_to(Phase.CLOSING)
        self._tg.cancel_scope.cancel()

    async def _idle_loop(self) -> None:
        """Start the answer a silence asks for (``turn_detection.idle_timeout_ms``), when it is
        due and nothing else is answering."""
        while True:
            await self._until(lambda: self.core.idle_at is not None and self.turn is None)
            assert self.core.idle_at is not None
            delay = self.core.idle_at - time.perf_counter()  # the clock answers end on
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._changed.wait()  # something changed: look again
                continue
            try:
                answer, timed_out = self.core.plan_idle()
                await self._start_turn(answer, time.perf_counter(), before=[timed_out])
            except SessionError as exc:
                log.info("idle timeout with nothing to answer over: %s", exc.message)

    # ------------------------------------------------------------------ warm prefix
    async def _warm_loop(self) -> None:
        """Keep the engine's prefix over the decoded frames warm while no answer runs, then
        check the session's watches on it (questions first, then warmup, then checks)."""
        while True:
            await self._until(lambda: self.turns.warm_due or self._check_wanted())
            if self.turns.warm_due:
                await self._warm()
                continue
            wait_s = self.core.check_due(time.monotonic())
            if wait_s:
                await anyio.sleep(wait_s)  # at most every min_check_interval_ms; then look again
                continue
            await self._check()

    def _check_wanted(self) -> bool:
        """True when nothing runs, the prefix is warm and a round of watch checks is wanted."""
        return (
            self.turns.state is TurnState.IDLE and not self.turns.behind and self.turn is None
            and self.engine.capabilities.token_probabilities
            and self.core.check_due(time.monotonic()) is not None
        )

    async def _warm(self) -> None:
        step = self.core.next_warm()
        if step is None:
            self.turns.nothing_to_warm()
            return
        scope = self._warm_scope = anyio.CancelScope()  # a question stops the prefill through it
        self.turns.warm()
        try:
            with scope:
                await self.engine.prefill(self.id, step.prompt)
        except EngineError as exc:
            log.warning("prefix warmup failed: %s", exc)
        finally:
            self._warm_scope = None
            self.core.warmed(step)
            self.turns.warmed()

    async def _check(self) -> None:
        """One round of watch checks on the warm prefix. It holds the engine as a prefill does,
        so a question stops it (and waits at most for the model step under way); a fire is
        answered like a question, its ``watch.fired`` first."""
        step = self.core.next_check(time.monotonic())
        if step is None:
            return
        results: list[tuple[str, float, float]] | None = None
        scope = self._warm_scope = anyio.CancelScope()
        self.turns.warm()
        started = time.perf_counter()
        try:
            with scope:
                checks = await self.engine.check(self.id, f"check_{self.id[:8]}", [p for _, p in step.prompts])
                ms = (time.perf_counter() - started) * 1000
                results = [(wid, c.probability, ms) for (wid, _), c in zip(step.prompts, checks, strict=True)]
        except EngineError as exc:
            log.warning("watch check failed: %s", exc)
        finally:
            self._warm_scope = None
            preempted = self.turns.state is not TurnState.WARMING  # a question came meanwhile
            self.turns.warmed()
        decisions = self.core.checked(step, None if preempted else results, time.monotonic(), now_ms())
        self.observer.checks(decisions.checks, decisions.skipped)
        fires = decisions.fires
        if fires and (self.turns.state is not TurnState.IDLE or self.turn is not None):
            fires = []  # a question came first: the watch is checked again after its answer
        if fires:
            fire = fires[0]  # one answer at a time; the others fire at their next check
            try:
                await self._start_turn(self.core.plan_watch(fire), time.perf_counter(), before=decisions.events)
                return
            except SessionError as exc:  # no usable frame left for its answer
                log.info("watch %s fired but cannot be answered: %s", fire.watch.watch_id, exc.message)
        await self._send_all(decisions.events)
