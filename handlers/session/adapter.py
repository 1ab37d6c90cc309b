"""One WebSocket session: the adapter between a transport and the session's core.

The core (``SessionMachine``) decides; the executor (``executor.py``) carries out its effects;
this adapter owns the connection: the first message and admission, the reader, the two lanes,
the byte budgets, resume and drain. All of a session's work runs in one task group (the
reader, the lanes, the timers, frame decodes, the engine's jobs); when the session ends, the
group is cancelled and awaited, so nothing it started outlives it.

Control comes before media: the reader hands the core each control message the moment it is
read (``Read``: ``ping`` is answered, a cancel or a new question stops the running answer);
frames go through the frame lane, everything else through the event lane, each in the order
read (``Handle``), so a question always sees the frames sent before it, and waits in its lane
while the core holds lane inputs behind the running answer's end.

Intake is bounded in bytes and sheds load (``intake.py``): a frame that does not fit the
session's or the server's read-ahead budget, or finds the queue full, or cannot start
decoding within ``intake_max_wait_ms`` of being read, is acked at once with
``reason: "overloaded"`` instead of waiting. Every frame with a ``frame_id`` gets an ack,
and a session whose messages are still waiting is never closed as idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup

from handlers.core.effects import Closed, FrameShed, Handle, Now, Opened, Read
from handlers.core.events import Event, SessionClosing, SessionReady
from handlers.core.machine import CONTROL, Phase, SessionMachine, Source, error_event
from handlers.core.negotiation import Limits, MemoryPolicy, opening_config
from handlers.core.rate_limit import ControlBudget, ControlLimits, Verdict

from handlers.session import log_context
from handlers.session.memory_jobs import Memory
from handlers.session.executor import Executor
from handlers.session.intake import Admission, IntakeLimits, ReadAhead
from handlers.session.observer import SessionObserver
from handlers.session.resume import ParkedSession, ParkingLot, digest
from handlers.session.transport import Decoded, Disconnected, Transport
from handlers.session.voice import voice_paths
from handlers.wire.codec import CloseConnection, V1Codec, WireCodec
from handlers.wire.commands import AnswerRequest, CancelRequest, ClearOutputAudio
from handlers.wire.errors import CLOSE_CODES, ErrorCode, Origin, SessionError
from handlers.wire.protocol import (
    AudioChunkIn,
    ResponseCancel,
    SessionConfig,
    VideoDone,
    VideoFrame,
    VideoQuery,
    origin_of,
)
from server import blocking
from server.engines.base import Engine
from server.speech.base import Voice

log = logging.getLogger("livesight.session")

#: Client events that are media: bounded by bytes and shed under load, not rate-limited.
MEDIA = (VideoFrame, AudioChunkIn)
#: Client events that start or stop an answer: they also take from the answer budget.
ANSWER_MOVES = (VideoQuery, AnswerRequest, ResponseCancel, CancelRequest, ClearOutputAudio)



class Session:
    """Runs one client connection from its first message to its end."""

    def __init__(
        self, transport: Transport, engine: Engine, limits: Limits, config_timeout_s: float, voice: Voice | None = None,
        codec: WireCodec | None = None,
        *, intake: IntakeLimits | None = None, read_ahead: ReadAhead | None = None, admission: Admission | None = None,
        observer: SessionObserver | None = None, parking: ParkingLot | None = None, owner: str = "",
        control: ControlLimits | None = None, memory: Memory | None = None, memory_policy: MemoryPolicy | None = None,
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
        self.control = ControlBudget(control or ControlLimits())
        self.observer = observer or SessionObserver()
        self.transport = transport
        self.codec = codec or V1Codec()  # the wire protocol: messages <-> core events
        self.engine = engine
        self.voice = voice or Voice()
        self.core = SessionMachine(
            self.id, limits, engine.capabilities, voice_paths(engine.capabilities, voice),
            Source(commits_audio=self.codec.commits_audio, native_trim_ms=self.voice.native_trim_ms),
            memory=memory_policy if memory is not None else None,
        )
        self.memory = memory
        self.config_timeout_s = config_timeout_s
        self._send_lock = asyncio.Lock()  # anyio's costs ~40 us a frame on the event loop
        self._changed = anyio.Event()  # set, and replaced, when a lane may look again
        self.executor: Executor | None = None
        self._tg: TaskGroup | None = None
        self.closed = False
        self.close_code = 1000
        self.ended = anyio.Event()
        self.parking, self.owner = parking, owner  # resume: where a dropped session waits; its key's digest
        self._resume_token: str | None = None
        self._ready: SessionReady | None = None
        self._dropped = False

    @property
    def settled(self) -> bool:
        """True when no decode, warmup or answer is running or wanted (benchmarks wait for it)."""
        return not self.waiting_messages and self.core.settled

    def _wake(self) -> None:
        """A frame was handled or the core took a step: whoever waits looks again."""
        self._changed.set()
        self._changed = anyio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` (a question about the lanes or the core's surface) is true."""
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
            events_in, events_out = anyio.create_memory_object_stream[object](self.core.limits.max_queue)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self.executor = Executor(self.core, self.engine, self.voice, tg, send=self.send,
                                         end=tg.cancel_scope.cancel, wake=self._wake, observer=self.observer, intake=self.intake,
                                         memory=self.memory)
                if not self.core.warm_prefix and self.core.config.prefix_warmup:
                    log.info("session %s: no prefix warmup, engine %r cannot keep a prefix",
                             self.id[:8], self.engine.capabilities.name)
                await self.executor.input(Opened())
                tg.start_soon(self.executor.timers)
                tg.start_soon(self._read, frames_in, events_in)
                tg.start_soon(self._take_frames, frames_out)
                tg.start_soon(self._take_events, events_out)
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
            await self._until(lambda: not self.core.answering)  # its end sent
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
        return True

    async def _start(self, config: SessionConfig) -> None:
        """Configure a new session, or take back the parked one whose token the config carries;
        sends ``session.ready`` (with a fresh resume token when resume is on)."""
        parked = None
        remembered = None  # an earlier session's memory, found by its handle
        if config.resume_token and self.parking is not None:
            try:
                parked = self.parking.claim(config.resume_token, self.owner)
            except SessionError as exc:
                remembered = await self._handle_memory(config.resume_token)
                if remembered is None:
                    await self.report(exc)  # then a new session with this config
            else:
                await self._handle_memory(config.resume_token)  # used: it never works again
        if parked is not None:
            self.id, self.core = parked.session_id, parked.core
            log_context.session_id.set(self.id)
            ready = self.core.resumed(parked.ready)
            log.info("session resumed at frame %r", self.core.last_frame_id)
        else:
            ready = self.core.configure(config, memory_of=remembered)
            if remembered is not None:
                log.info("session continues the memory of session %s", remembered[:8])
        self._ready = ready.model_copy(update={"resumed": False, "last_frame_id": None})
        await self._claim_memory(ready.memory_id)
        if self.parking is not None:
            self._resume_token = self.parking.new_token()
            ready = ready.model_copy(update={"resume_token": self._resume_token})
            await self._keep_handle(self._resume_token, ready.memory_id)
        await self.send(ready)

    async def _handle_memory(self, token: str) -> str | None:
        """The memory id a resume token (of a session no longer parked: closed, expired, on
        another server or before a restart) continues, taken from the store (single use)."""
        if self.memory is None:
            return None
        try:
            return await self.memory.store.take_handle(digest(token), self.owner)
        except (OSError, RuntimeError) as exc:
            log.warning("the memory store could not be asked for a handle: %s", exc)
            return None

    async def _claim_memory(self, memory_id: str | None) -> None:
        """The session's memory belongs to its client's key (its moments' HTTP views check it)."""
        if self.memory is None or memory_id is None:
            return
        try:
            await self.memory.store.claim(memory_id, self.owner, time.time() * 1000)
        except (OSError, RuntimeError) as exc:
            log.warning("the memory store could not record the session's owner: %s", exc)

    async def _keep_handle(self, token: str, memory_id: str | None) -> None:
        """Let ``token`` find this session's memory (``memory_id``; None: it keeps none) again
        after its connection ends."""
        if self.memory is None or memory_id is None:
            return
        try:
            await self.memory.store.keep_handle(digest(token), memory_id, self.owner, time.time() * 1000)
        except (OSError, RuntimeError) as exc:
            log.warning("the memory store could not keep a handle: %s", exc)

    def _parkable(self) -> bool:
        """True when the connection dropped from a ready session that can be resumed."""
        return (
            self.parking is not None and self._resume_token is not None and self._ready is not None
            and self._dropped and self.core.phase is Phase.READY and self.close_code == 1000
        )

    async def _fail(self, exc: SessionError) -> None:
        """Send a closing error and close."""
        await self.report(exc)
        self.core.receive(Closed(), Now.read())
        await self.transport.close(CLOSE_CODES.get(exc.code, 1008))

    # ------------------------------------------------------------------ errors and sending
    async def send(self, event: Event) -> None:
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
        self.core.receive(Closed(), Now.read())
        await self.transport.close(close.code, close.reason)
        raise Disconnected(close.code)

    async def report(self, exc: SessionError, origin: Origin | None = None) -> None:
        """The one place a ``SessionError`` becomes an ``error`` event (``origin``: the client
        event it answers, when the error does not name one itself)."""
        await self.send(error_event(exc, origin))

    # ------------------------------------------------------------------ reader
    async def _read(
        self, frames: anyio.abc.ObjectSendStream[object], turns: anyio.abc.ObjectSendStream[object]
    ) -> None:
        """Read messages: answer control at once (within the session's control budget), queue
        frames to the frame lane and everything else to the event lane. Each message is one
        turn of the event loop at most: the reader yields after every message, so a session
        with a backlog of buffered messages cannot hold the loop from the others."""
        async with frames, turns:
            try:
                await self._read_lanes(frames, turns)
            except anyio.BrokenResourceError:  # a lane ended first: the session is closing, and its
                return  # own exception (a peer that reads nothing, a send that failed) says why

    async def _read_lanes(self, frames: anyio.abc.ObjectSendStream[object],
                          turns: anyio.abc.ObjectSendStream[object]) -> None:
        """``_read``'s loop, until ``video.done``."""
        while True:
            raw = await self._receive_or_idle()
            await anyio.lowlevel.checkpoint()
            try:
                events = raw.events if isinstance(raw, Decoded) else self.codec.decode(raw)
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
                if isinstance(event, VideoFrame):
                    await self._read_frame(frames, event)
                    continue
                if not isinstance(event, AudioChunkIn):
                    await self.executor.input(Read(event))  # control at once; a question stops the answer
                if isinstance(event, CONTROL):
                    continue
                self.waiting_messages += 1
                await turns.send((event, time.monotonic(), self.frames_read))
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

    async def _read_frame(self, queue: anyio.abc.ObjectSendStream[object], event: VideoFrame) -> None:
        """Queue a frame within the byte budgets, or shed it with an ``overloaded`` ack."""
        size = len(event.data)
        if self.read_ahead_bytes + size <= self.intake.max_read_ahead_bytes and self.server_read_ahead.take(size):
            try:
                queue.send_nowait((event, time.monotonic(), size))
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
        await self.executor.input(FrameShed(event))

    async def _receive_or_idle(self) -> str | bytes | Decoded:
        """Next message; raises the idle timeout when nothing came and nothing is running."""
        while True:
            with anyio.move_on_after(self.core.limits.idle_timeout_s):
                return await self.transport.receive()
            if not self.core.answering and not self.waiting_messages:
                await self._fail(
                    SessionError(ErrorCode.IDLE_TIMEOUT, f"nothing received for {self.core.limits.idle_timeout_s:g} s")
                )
                raise Disconnected

    # ------------------------------------------------------------------ lanes
    async def _take_frames(self, queue: anyio.abc.ObjectReceiveStream[object]) -> None:
        """Check, filter and ack frames in the order read, never waiting for an answer."""
        async with queue:
            async for event, received, size in queue:
                try:
                    await self.executor.input(Handle(event, received), origin_of(event))
                finally:
                    self.waiting_messages -= 1
                    self.read_ahead_bytes -= size
                    self.server_read_ahead.give(size)
                    self.frames_unacked -= 1
                    blocking.frame_done()
                    self.frames_handled += 1
                    self._wake()

    async def _take_events(self, queue: anyio.abc.ObjectReceiveStream[object]) -> None:
        """Audio, questions, commands and ``video.done`` in the order read; each first waits
        until the frame lane has handled every frame read before it (so a question sees them)
        and the core takes lane input again, while frames read after it go on being acked."""
        async with queue:
            async for event, received, frames_before in queue:
                try:
                    await self._until(lambda: self.frames_handled >= frames_before and self.core.takes_lane_input)
                    await self.executor.input(Handle(event, received), origin_of(event))
                finally:
                    self.waiting_messages -= 1
