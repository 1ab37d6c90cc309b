"""One WebSocket session: the adapter between a transport, the core and an engine.

All of a session's work runs in one task group: the reader, the processor, frame decodes,
the prefix warmup and the running answer. When the session ends, the group is cancelled
and awaited, so nothing it started outlives it.

Control comes before media: the reader answers ``ping`` and interrupts a running answer
(``response.cancel``, ``video.query``) the moment it reads them; frames, audio, queries and
``video.done`` then go in order through a bounded queue to the processor, so a question
always sees the frames sent before it.

Voice: with server turn detection the processor runs each audio chunk through the voice
activity model; speech that starts interrupts the running answer (barge-in), speech that
stops starts an answer. An answer first transcribes its audio when the engine cannot hear,
and speaks its text sentence by sentence when the engine cannot speak (``speech.py``).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from functools import partial

import anyio
from anyio.abc import TaskGroup

from handlers import blocking
from handlers.codec import V1Codec, WireCodec
from handlers.commands import AnswerRequest, Command
from handlers.core import (
    FrameIntake,
    Limits,
    Phase,
    QueryPlan,
    SessionCore,
    SpokenQuestion,
    VoicePaths,
    decode_base64,
)
from handlers.decoder import decode_image
from handlers.errors import CLOSE_CODES, ErrorCode, SessionError
from handlers.frames import Frame, content_key
from handlers.protocol import (
    AudioChunkIn,
    ErrorEvent,
    InputAudioSpeechStarted,
    InputAudioSpeechStopped,
    Ping,
    Pong,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseCancel,
    ResponseDone,
    ResponseTextDelta,
    ResponseTextDone,
    ServerEvent,
    SessionConfig,
    SessionDone,
    Timings,
    UsageInfo,
    VideoDone,
    VideoFrame,
    VideoQuery,
)
from handlers.similarity import thumbnail
from handlers.speech import NativeAudioTrim, SpokenAnswer
from handlers.transport import Disconnected, Transport
from handlers.turn_detection import SpeechStarted, SpeechStopped
from server.engines.base import AudioChunk, Capabilities, Engine, EngineError, Finished, TextDelta
from server.speech.base import SpeechError, VadStream, Voice

log = logging.getLogger("livesight.session")


def now_ms() -> float:
    return time.time() * 1000.0


class _SessionOver(Exception):
    """Raised inside the session to end it after a closing error or ``video.done``."""


@dataclass
class Turn:
    """The running answer: its plan and the cancel scope that interrupts it."""

    plan: QueryPlan
    scope: anyio.CancelScope
    done: anyio.Event
    received: float  # perf_counter when the query was read (or speech stopped): timings count from here
    first_audio_ms: float | None = None


def _prepare_frame(data: str, frame_id: str | int | None) -> tuple[bytes, str, object]:
    """Blocking part of frame intake: base64, content key and similarity thumbnail."""
    raw = decode_base64(data, ErrorCode.INVALID_IMAGE, "frame data", frame_id)
    try:
        thumb = thumbnail(raw)
    except ValueError as exc:
        raise SessionError(
            ErrorCode.INVALID_IMAGE, f"image could not be decoded: {exc}", frame_id=None if frame_id is None else str(frame_id)
        ) from None
    return raw, content_key(raw), thumb


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
    ) -> None:
        self.id = uuid.uuid4().hex
        self.transport = transport
        self.codec = codec or V1Codec()  # the wire protocol: messages <-> core events
        self.engine = engine
        self.voice = voice or Voice()
        self.core = SessionCore(self.id, limits, engine.capabilities, voice_paths(engine.capabilities, voice))
        self._vad_stream: VadStream | None = None
        self.config_timeout_s = config_timeout_s
        self.turn: Turn | None = None
        self._send_lock = anyio.Lock()
        self._decoding: dict[int, anyio.Event] = {}
        self._warm_wanted = anyio.Event()
        self._warm_scope: anyio.CancelScope | None = None
        self._warm_idle = anyio.Event()
        self._warm_idle.set()
        self._tg: TaskGroup | None = None
        self.closed = False

    @property
    def settled(self) -> bool:
        """True when no decode, warmup or answer is running or wanted (benchmarks wait for it)."""
        warm_busy = self.core.warm_prefix and (self._warm_wanted.is_set() or not self._warm_idle.is_set())
        return not self._decoding and self.turn is None and not warm_busy

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve the connection until it ends; never raises for client behaviour."""
        try:
            if not await self._configure():
                return
            send, receive = anyio.create_memory_object_stream[object](self.core.limits.max_queue)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._read, send)
                tg.start_soon(self._process, receive)
                if self.core.warm_prefix:
                    tg.start_soon(self._warm_loop)
                elif self.core.config.prefix_warmup:
                    log.info("session %s: no prefix warmup, engine %r cannot keep a prefix",
                             self.id[:8], self.engine.capabilities.name)
        except* Disconnected:
            pass  # the client left (or an idle/closing error was sent)
        finally:
            with anyio.CancelScope(shield=True):
                self.core.close()
                await self.engine.release(self.id)
                await self.transport.close(1000)
                self.closed = True

    async def _configure(self) -> bool:
        """Wait for ``session.config`` (or take the codec's opening one); returns False when
        the session must close."""
        events = self.codec.opening()
        try:
            if not events:
                with anyio.fail_after(self.config_timeout_s):
                    raw = await self.transport.receive()
        except TimeoutError:
            await self._fail(SessionError(ErrorCode.CONFIG_TIMEOUT, f"no session.config within {self.config_timeout_s:g} s"))
            return False
        try:
            events = events or self.codec.decode(raw)
            event = events[0] if len(events) == 1 else None
            if not isinstance(event, SessionConfig):
                raise SessionError(ErrorCode.INVALID_CONFIG, "the first message must be session.config")
        except SessionError as exc:
            if exc.code in {ErrorCode.INVALID_JSON, ErrorCode.INVALID_MESSAGE, ErrorCode.UNKNOWN_TYPE}:
                exc = SessionError(ErrorCode.INVALID_CONFIG, f"the first message must be session.config ({exc.message})")
            await self._fail(exc)
            return False
        await self.send(self.core.configure(event))
        if self.core.detector is not None and self.voice.vad is not None:
            self._vad_stream = self.voice.vad.open_stream()
        return True

    async def _fail(self, exc: SessionError) -> None:
        """Send a closing error and close."""
        await self.report(exc)
        self.core.move_to(Phase.CLOSED)
        await self.transport.close(CLOSE_CODES.get(exc.code, 1008))

    # ------------------------------------------------------------------ errors and sending
    async def send(self, event: ServerEvent) -> None:
        async with self._send_lock:
            for text in self.codec.encode(event):
                await self.transport.send(text)

    async def report(self, exc: SessionError) -> None:
        """The one place a ``SessionError`` becomes an ``error`` event."""
        await self.send(
            ErrorEvent(code=exc.code.value, message=exc.message, frame_id=exc.frame_id, closes_session=exc.closes_session)
        )

    # ------------------------------------------------------------------ reader
    async def _read(self, queue: anyio.abc.ObjectSendStream[object]) -> None:
        async with queue:
            while True:
                raw = await self._receive_or_idle()
                try:
                    events = self.codec.decode(raw)
                except SessionError as exc:
                    await self.report(exc)
                    continue
                for event in events:
                    if isinstance(event, Ping):
                        await self.send(Pong())
                    elif isinstance(event, ResponseCancel):
                        await self.interrupt()
                    elif isinstance(event, SessionConfig):
                        await self.report(SessionError(ErrorCode.INVALID_MESSAGE, "the session is already configured"))
                    else:
                        if isinstance(event, (VideoQuery, AnswerRequest)):
                            await self.interrupt()
                        await queue.send((event, time.perf_counter()))
                        if isinstance(event, VideoDone):
                            return

    async def _receive_or_idle(self) -> str | bytes:
        """Next message; raises the idle timeout when nothing came and nothing is running."""
        while True:
            with anyio.move_on_after(self.core.limits.idle_timeout_s):
                return await self.transport.receive()
            if self.turn is None:
                await self._fail(
                    SessionError(ErrorCode.IDLE_TIMEOUT, f"nothing received for {self.core.limits.idle_timeout_s:g} s")
                )
                raise Disconnected

    # ------------------------------------------------------------------ processor
    async def _process(self, queue: anyio.abc.ObjectReceiveStream[object]) -> None:
        async with queue:
            async for event, received in queue:
                try:
                    if isinstance(event, VideoFrame):
                        await self._on_frame(event)
                    elif isinstance(event, AudioChunkIn):
                        await self._on_audio(event)
                    elif isinstance(event, VideoQuery):
                        await self._on_query(event, received)
                    elif isinstance(event, VideoDone):
                        await self._on_done()
                        return
                    elif isinstance(event, AnswerRequest):
                        await self.interrupt()
                        await self._start_turn(self.core.plan_answer(event), received)
                    elif isinstance(event, Command):
                        await self._on_command(event)
                except SessionError as exc:
                    await self.report(exc)

    async def _on_frame(self, event: VideoFrame) -> None:
        self.core.check_frame_size(event)
        received = now_ms()
        raw, key, thumb = await blocking.run_blocking(_prepare_frame, event.data, event.frame_id)
        intake: FrameIntake = self.core.accept_frame(event, raw, key, thumb, received)
        if intake.evicted and self.core.warm_prefix:
            self._warm_wanted.set()
        if intake.ack is not None:
            await self.send(intake.ack)
        if intake.frame is not None:
            done = anyio.Event()
            self._decoding[intake.frame.seq] = done
            self._tg.start_soon(self._decode, intake.frame, done)

    async def _decode(self, frame: Frame, done: anyio.Event) -> None:
        """Decode one frame off the loop (once per distinct image)."""
        try:
            image = self.core.buffer.decoded_image(frame.key)
            started = time.perf_counter()
            if image is None:
                side = self.core.capabilities.max_image_side
                try:
                    image = await blocking.run_blocking(decode_image, frame.data, side) if frame.data else None
                except ValueError as exc:
                    if not frame.released:
                        await self.report(self.core.reject_frame(frame, str(exc)))
                    return
            if image is not None and not frame.released:
                frame.image = image
                frame.decode_ms = round((time.perf_counter() - started) * 1000, 3)
                frame.decoded_ts_ms = now_ms()
                if self.core.warm_prefix:
                    self._warm_wanted.set()
        finally:
            self._decoding.pop(frame.seq, None)
            done.set()

    async def _frames_ready(self, frames: list[Frame]) -> None:
        for frame in frames:
            pending = self._decoding.get(frame.seq)
            if pending is not None:
                await pending.wait()

    # ------------------------------------------------------------------ microphone
    async def _on_audio(self, event: AudioChunkIn) -> None:
        """Buffer microphone audio; with turn detection, act on speech starting and stopping."""
        pcm = self.core.add_audio(event.data)
        if self._vad_stream is None or self.voice.vad is None:
            return
        try:
            probabilities = await self.voice.vad.probabilities(self._vad_stream, pcm)
        except SpeechError as exc:
            log.warning("voice activity detection failed: %s", exc)
            raise SessionError(ErrorCode.INTERNAL_ERROR, "turn detection failed on this audio") from None
        for decision in self.core.detect_turns(probabilities):
            if isinstance(decision, SpeechStarted):
                await self.send(InputAudioSpeechStarted(audio_start_ms=decision.start_ms))
                await self.interrupt()  # barge-in: the speaker talks over the answer
            elif isinstance(decision, SpeechStopped):
                await self.send(InputAudioSpeechStopped(audio_start_ms=decision.start_ms, audio_end_ms=decision.end_ms))
            elif isinstance(decision, SpokenQuestion):
                await self.interrupt()
                await self._start_turn(self.core.plan_spoken_query(decision), time.perf_counter())

    async def _on_command(self, command: Command) -> None:
        """A core command from a codec (items, audio commits, config updates)."""
        detector = self.core.detector
        for event in self.core.apply(command):
            await self.send(event)
        if self.core.detector is not detector:  # turn detection was switched: fresh audio
            vad = self.voice.vad
            self._vad_stream = vad.open_stream() if self.core.detector is not None and vad is not None else None

    # ------------------------------------------------------------------ answers
    async def _on_query(self, event: VideoQuery, received: float) -> None:
        await self.interrupt()  # a turn may have started between reader and processor
        await self._start_turn(self.core.plan_query(event), received)

    async def _start_turn(self, plan: QueryPlan, received: float) -> None:
        """Wait for the plan's frames, stop warmup, then start the answer task."""
        # The turn exists from here on, so the warm loop starts no new prefill.
        turn = self.turn = Turn(plan, anyio.CancelScope(), anyio.Event(), received)
        try:
            await self._frames_ready(plan.frames)
            self.core.settle_frames(plan)
            await self._stop_warmup()
        except BaseException:
            self.core.finish(plan, None)
            self.turn = None
            turn.done.set()
            raise
        self._tg.start_soon(self._answer, turn)

    async def interrupt(self) -> None:
        """Cancel the running answer, if any, and wait until it has ended."""
        turn = self.turn
        if turn is not None:
            turn.scope.cancel()
            await turn.done.wait()

    async def _answer(self, turn: Turn) -> None:
        plan = turn.plan
        started = turn.received
        status, reason, usage = "interrupted", None, UsageInfo()
        ttft = None
        text: list[str] = []
        spoken: SpokenAnswer | None = None
        try:
            await self.send(self.core.start_event(plan))
            with turn.scope:
                if self.core.needs_transcription(plan):
                    await self._transcribe(plan)
                spoken = await self._start_speech(turn)
                trim = NativeAudioTrim(self.voice.native_trim_ms)
                wants_audio = "audio" in plan.modalities
                prompt = self.core.query_prompt(plan)
                stream = self.engine.generate(self.id, plan.request_id, prompt, plan.sampling)
                finished: Finished | None = None
                try:
                    async for out in stream:
                        if ttft is None:
                            ttft = (time.perf_counter() - started) * 1000
                            await self.send(self.core.consumed(plan))
                        if isinstance(out, TextDelta):
                            text.append(out.text)
                            await self.send(ResponseTextDelta(request_id=plan.request_id, delta=out.text))
                            if spoken is not None:
                                await spoken.add_text(out.text)
                        elif isinstance(out, AudioChunk):
                            wav = trim.apply(out.wav) if wants_audio and spoken is None else b""
                            if wav:  # the engine's own voice: passed on, never re-synthesized
                                await self._send_audio(turn, wav)
                        elif isinstance(out, Finished):
                            finished = out
                            usage = UsageInfo(**asdict(out.usage))
                finally:
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()  # aborts the engine request if it is still running
                if spoken is not None:
                    await spoken.finish()
                if finished is not None:
                    status, reason = "completed", finished.finish_reason
        except SessionError as exc:
            status, reason = "failed", "error"
            await self.report(exc)
        except EngineError as exc:
            log.warning("engine failed request %s: %s", plan.request_id, exc)
            status, reason = "failed", "error"
            await self.report(SessionError(ErrorCode.ENGINE_ERROR, "the engine failed to answer"))
        except Disconnected:
            raise
        except Exception:
            log.exception("bug while answering %s", plan.request_id)
            status, reason = "failed", "error"
            await self.report(SessionError(ErrorCode.INTERNAL_ERROR, "internal error while answering"))
        finally:
            with anyio.CancelScope(shield=True):
                if spoken is not None:
                    await spoken.cancel()  # nothing of this answer is spoken after its response.done
                self.core.finish(plan, "".join(text) if status != "failed" else None)
                await self._finish_answer(plan, status, reason, usage, ttft, turn.first_audio_ms, started, "".join(text))
                self.turn = None
                turn.done.set()
                if self.core.warm_prefix:
                    self._warm_wanted.set()

    async def _transcribe(self, plan: QueryPlan) -> None:
        """Turn the plan's audio into its question; sends ``input_audio.transcript``.
        Raises ``transcription_failed``."""
        assert plan.audio is not None and self.voice.transcriber is not None
        try:
            transcript = await self.voice.transcriber.transcribe(plan.audio.pcm16)
        except SpeechError as exc:
            log.warning("transcription failed for %s: %s", plan.request_id, exc)
            raise SessionError(ErrorCode.TRANSCRIPTION_FAILED, "the spoken question could not be transcribed") from None
        await self.send(self.core.apply_transcript(plan, transcript))

    async def _start_speech(self, turn: Turn) -> SpokenAnswer | None:
        """A running speaker for this answer when the session wants audio the engine cannot make."""
        config = self.core.config
        synthesizer = self.voice.synthesizer
        if "audio" not in turn.plan.modalities or not self.core.voice.speaks or synthesizer is None:
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

    async def _send_audio(self, turn: Turn, wav: bytes) -> None:
        if turn.first_audio_ms is None:
            turn.first_audio_ms = (time.perf_counter() - turn.received) * 1000
        await self.send(ResponseAudioDelta(request_id=turn.plan.request_id, data=_b64(wav)))

    async def _finish_answer(
        self, plan: QueryPlan, status: str, reason: str | None, usage: UsageInfo,
        ttft: float | None, first_audio: float | None, started: float, text: str,
    ) -> None:
        """Close an answer on the wire: text done, audio done, then ``response.done``."""
        try:
            if status == "completed" or text:
                await self.send(ResponseTextDone(request_id=plan.request_id, text=text))
            if first_audio is not None:
                await self.send(ResponseAudioDone(request_id=plan.request_id))
            timings = Timings(
                ttft_ms=None if ttft is None else round(ttft, 2),
                first_audio_ms=None if first_audio is None else round(first_audio, 2),
                total_ms=round((time.perf_counter() - started) * 1000, 2),
            )
            await self.send(
                ResponseDone(
                    request_id=plan.request_id, status=status,
                    finish_reason=reason or ("abort" if status == "interrupted" else None),
                    usage=usage, timings=timings,
                )
            )
        except Disconnected:
            pass  # the client left; the session is ending anyway

    async def _on_done(self) -> None:
        """``video.done``: let the running answer finish, then say goodbye."""
        turn = self.turn
        if turn is not None:
            await turn.done.wait()
        await self.send(SessionDone())
        self.core.move_to(Phase.CLOSING)
        self._tg.cancel_scope.cancel()

    # ------------------------------------------------------------------ warm prefix
    async def _warm_loop(self) -> None:
        """Keep the engine's prefix over the decoded frames warm while no answer runs."""
        while True:
            await self._warm_wanted.wait()
            self._warm_wanted = anyio.Event()
            if self.turn is not None:
                continue
            frames = self.core.warm_frames()
            if not frames:
                continue
            self.core.buffer.pin(frames)
            self._warm_idle = anyio.Event()
            try:
                with anyio.CancelScope() as scope:
                    self._warm_scope = scope
                    await self.engine.prefill(self.id, self.core.warm_prompt(frames))
            except EngineError as exc:
                log.warning("prefix warmup failed: %s", exc)
            finally:
                self._warm_scope = None
                self.core.buffer.unpin(frames)
                self._warm_idle.set()

    async def _stop_warmup(self) -> None:
        if self._warm_scope is not None:
            self._warm_scope.cancel()
        await self._warm_idle.wait()


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")
