"""Carries out what a session's core says, in the session's task group.

``Executor.input`` and ``Executor.result`` hand the core (``SessionMachine``) an input or a
job's result and run the effects it returns, in order: events go to ``send``; jobs the lane
waits for (preparing a frame, judging audio for speech, transcribing a held question) run
here, and their results go back to the core at once; the engine's jobs (a prefill, a round of
checks, an answer) and the transcriptions and speakers they use run as children of the task
group, each in a cancel scope that ``Stop`` cancels, and report their end to the core. It
decides nothing: every choice is the core's; it holds only the handles of what runs.

Anything that carries a session's effects can use it: the WebSocket adapter (``adapter.py``)
and a session with no socket at all (``sourced.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskGroup

from handlers.core.answer import Answer, Outcome
from handlers.core.effects import (
    Check,
    Checked,
    Caption,
    FindMemory,
    ForgetMemory,
    KeepCaption,
    KeepMoment,
    KeepNote,
    LoadMoments,
    Recall,
    DetectSpeech,
    Effect,
    Ended,
    EndSession,
    FrameShed,
    Generate,
    Generated,
    HeldTranscribed,
    Input,
    ListenFeed,
    ListenStart,
    Now,
    Prefill,
    Prepare,
    Prepared,
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
    Timer,
    Transcribed,
    TranscribeHeld,
    Warmed,
)
from handlers.core.events import Event
from handlers.core.jobs import CheckStep, WarmStep
from handlers.core.machine import SessionMachine, error_event
from handlers.media.preparation import decode_prepared, prepare_frame
from handlers.session import log_context
from handlers.session.intake import IntakeLimits
from handlers.session.memory_jobs import Memory, MemoryJobs
from handlers.session.observer import SessionObserver
from handlers.session.transport import Disconnected
from handlers.session.voice import Listening, SpokenAnswer
from handlers.wire.errors import ErrorCode, Origin, SessionError
from server import blocking
from server.engines.base import Engine, EngineError
from server.speech.base import SpeechError, VadStream, Voice

log = logging.getLogger("livesight.session")


class Executor(MemoryJobs):
    """Runs one session's effects (see the module docstring). ``send`` delivers an event;
    ``end`` is called for ``EndSession``; ``wake`` after every step of the core (whoever
    waits on its surface looks again)."""

    def __init__(
        self, core: SessionMachine, engine: Engine, voice: Voice, tg: TaskGroup, *,
        send: Callable[[Event], Awaitable[None]], end: Callable[[], None], wake: Callable[[], None] = lambda: None,
        observer: SessionObserver | None = None, intake: IntakeLimits | None = None, memory: Memory | None = None,
    ) -> None:
        self.core, self.engine, self.voice, self._tg = core, engine, voice, tg
        self.memory = memory
        self._send, self._end, self._wake = send, end, wake
        self.observer = observer or SessionObserver()
        self.intake = intake or IntakeLimits()
        self._scopes: dict[int, anyio.CancelScope] = {}  # the running jobs', by id of their step or answer
        self._speakers: dict[int, SpokenAnswer] = {}
        self._listening: Listening | None = None
        self._vad: VadStream | None = None
        self._deadline: float | None = None
        self._timer_moved = anyio.Event()

    # ------------------------------------------------------------------ driving the core
    async def input(self, item: Input, origin: Origin | None = None) -> None:
        """Hand the core an input and carry out its effects (``origin``: the client event a
        failed job of the lane answers)."""
        await self.execute(self.core.receive(item, Now.read()), origin)

    async def result(self, result: Result, origin: Origin | None = None) -> None:
        """Hand the core a job's result and carry out its effects."""
        await self.execute(self.core.completed(result, Now.read()), origin)

    async def execute(self, effects: list[Effect], origin: Origin | None = None) -> None:
        """Carry out ``effects`` in order. A job of the lane that fails on the client's input
        (a frame that does not decode) gets its error event, naming ``origin``."""
        self._wake()
        for effect in effects:
            try:
                await self._RUN[type(effect)](self, effect, origin)
            except SessionError as exc:
                await self.report(exc, origin)

    async def report(self, exc: SessionError, origin: Origin | None = None) -> None:
        """Send the error event of ``exc``."""
        await self._send(error_event(exc, origin))

    async def timers(self) -> None:
        """Tick the core when the time it asked for (``Timer``) comes; runs for the session."""
        while True:
            moved = self._timer_moved
            if self._deadline is None:
                await moved.wait()
                continue
            with anyio.move_on_after(max(0.0, self._deadline - time.monotonic())):
                await moved.wait()
                continue
            self._deadline = None
            await self.input(Tick())

    # ------------------------------------------------------------------ effects
    async def _do_send(self, effect: Send, origin: Origin | None) -> None:
        await self._send(effect.event)

    async def _tally(self, effect: Tally, origin: Origin | None) -> None:
        if effect.what == "checks":
            self.observer.checks(effect.n, 0)
        elif effect.what == "skipped":
            self.observer.checks(0, effect.n)
        elif effect.what in ("captions", "captions_skipped"):
            self.observer.captions(effect.n if effect.what == "captions" else 0,
                                   effect.n if effect.what == "captions_skipped" else 0)
        else:
            self.observer.frames(effect.what, effect.n)

    async def _stray(self, effect: Effect, origin: Origin | None) -> None:
        raise RuntimeError(f"{type(effect).__name__} is only carried out by the answer it belongs to")

    async def _timer(self, effect: Timer, origin: Origin | None) -> None:
        self._deadline = effect.at
        self._timer_moved.set()
        self._timer_moved = anyio.Event()

    async def _end_session(self, effect: EndSession, origin: Origin | None) -> None:
        self._end()

    async def _stop(self, effect: Stop, origin: Origin | None) -> None:
        scope = self._scopes.get(id(effect.job))
        if scope is not None:
            scope.cancel()

    async def _prepare(self, effect: Prepare, origin: Origin | None) -> None:
        """Prepare the frame off the loop (taking turns with other sessions), in its lane."""
        event, side = effect.event, effect.side
        deadline = time.perf_counter() + effect.received + self.intake.intake_max_wait_ms / 1000 - time.monotonic()
        try:
            prepared = await blocking.run_fair(prepare_frame, event.data, event.frame_id, self.intake, side,
                                               deadline=deadline)
            if prepared.image is None:
                prepared = await blocking.run_fair(decode_prepared, prepared, event.frame_id, self.intake, side,
                                                   deadline=deadline, heavy=True)
        except blocking.Overloaded:
            await self.input(FrameShed(event))
            return
        await self.result(Prepared(event, prepared, effect.receive_ms))

    async def _prefill(self, effect: Prefill, origin: Origin | None) -> None:
        scope = self._scopes[id(effect.step)] = anyio.CancelScope()  # a Stop may come before it runs
        self._tg.start_soon(self._warm, effect.step, scope)

    async def _warm(self, step: WarmStep, scope: anyio.CancelScope) -> None:
        """A prefill as a child of the session; a question stops it through its scope."""
        done = False
        try:
            with scope:
                await self.engine.prefill(self.core.session_id, step.prompt)
                done = True
        except EngineError as exc:
            log.warning("prefix warmup failed: %s", exc)
        finally:
            del self._scopes[id(step)]
            with anyio.CancelScope(shield=True):
                await self.result(Warmed(step, done))

    async def _check(self, effect: Check, origin: Origin | None) -> None:
        scope = self._scopes[id(effect.step)] = anyio.CancelScope()
        self._tg.start_soon(self._run_checks, effect.step, scope)

    async def _run_checks(self, step: CheckStep, scope: anyio.CancelScope) -> None:
        """One round of watch checks on the warm prefix; a question stops it (and waits at
        most for the model step under way)."""
        results: list[tuple[str, float, float]] | None = None
        started = time.perf_counter()
        session = self.core.session_id
        try:
            with scope:
                checks = await self.engine.check(session, f"check_{session[:8]}", [p for _, p in step.prompts])
                ms = (time.perf_counter() - started) * 1000
                results = [(wid, c.probability, ms) for (wid, _), c in zip(step.prompts, checks, strict=True)]
        except EngineError as exc:
            log.warning("watch check failed: %s", exc)
        finally:
            del self._scopes[id(step)]
            with anyio.CancelScope(shield=True):
                await self.result(Checked(step, results))

    # ------------------------------------------------------------------ answers
    async def _start_answer(self, effect: StartAnswer, origin: Origin | None) -> None:
        scope = self._scopes[id(effect.answer)] = anyio.CancelScope()
        if effect.answer.stopping:  # stopped while it waited for the engine: it starts and ends at once
            scope.cancel()
        listening = self._take_listening() if effect.take_listening else None
        self._tg.start_soon(self._answer, effect, scope, listening)

    async def _answer(self, run: StartAnswer, scope: anyio.CancelScope, listening: Listening | None) -> None:
        """Run one answer to its end; every event of it comes from the core."""
        answer = run.answer
        log_context.request_id.set(answer.request_id)  # this task's own context: log lines name the answer
        outcome, error_code = Outcome.INTERRUPTED, None
        spoken: SpokenAnswer | None = None
        try:
            with scope:
                prompt = run.prompt
                if run.transcribe:
                    assert answer.audio is not None
                    transcript = await self._words(answer.audio.pcm16, listening, answer.request_id)
                    listening = None
                    prompt = await self._prompt_after(Transcribed(answer, transcript))
                if run.speak:
                    spoken = await self._speaker(answer)
                assert prompt is not None
                stream = self.engine.generate(self.core.session_id, answer.request_id, prompt, answer.sampling)
                try:
                    async for out in stream:
                        await self.result(Generated(answer, out))
                finally:
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()  # aborts the engine request if it is still running
                if spoken is not None:
                    await spoken.finish()
                if answer.finished is not None:
                    outcome = Outcome.COMPLETED
        except SessionError as exc:
            outcome, error_code = Outcome.FAILED, exc.code.value
            await self.report(exc, answer.asked_by)
        except EngineError as exc:
            log.warning("engine failed request %s: %s", answer.request_id, exc)
            outcome, error_code = Outcome.FAILED, ErrorCode.ENGINE_ERROR.value
            await self.report(SessionError(ErrorCode.ENGINE_ERROR, "the engine failed to answer"), answer.asked_by)
        except Disconnected:
            raise
        except Exception:
            log.exception("bug while answering %s", answer.request_id)
            outcome, error_code = Outcome.FAILED, ErrorCode.INTERNAL_ERROR.value
            await self.report(SessionError(ErrorCode.INTERNAL_ERROR, "internal error while answering"), answer.asked_by)
        finally:
            with anyio.CancelScope(shield=True):
                self._speakers.pop(id(answer), None)
                if spoken is not None:
                    await spoken.cancel()  # nothing of this answer is spoken after its response.done
                if listening is not None:
                    await listening.cancel()  # an interrupted transcription stops at once
                del self._scopes[id(answer)]
                try:
                    await self.result(Ended(answer, outcome, error_code))
                except Disconnected:
                    pass  # the client left; the session is ending anyway

    async def _prompt_after(self, transcribed: Transcribed) -> object:
        """Hand the core the answer's words; returns the prompt it generates from (``Generate``)."""
        prompt = None
        for effect in self.core.completed(transcribed, Now.read()):
            if isinstance(effect, Generate):
                prompt = effect.prompt
            else:
                await self.execute([effect])
        return prompt

    async def _speaker(self, answer: Answer) -> SpokenAnswer:
        """A running speaker for the answer: its pieces of speech go back to the core."""
        synthesizer = self.voice.synthesizer
        assert synthesizer is not None
        config = self.core.config

        async def deliver(wav: bytes, words: str = "") -> None:
            await self.result(Spoken(answer, wav, words))

        spoken = SpokenAnswer(
            synthesizer, config.voice or synthesizer.default_voice, config.speech_rate,
            max_sentence_chars=self.voice.max_sentence_chars, max_pending_sentences=self.voice.max_pending_sentences,
            pause_ms=self.voice.sentence_pause_ms, deliver=deliver, report=self.report,
        )
        await self._tg.start(spoken.run)
        self._speakers[id(answer)] = spoken
        return spoken

    async def _speak(self, effect: Speak, origin: Origin | None) -> None:
        spoken = self._speakers.get(id(effect.answer))
        if spoken is not None:
            await spoken.add_text(effect.text)

    # ------------------------------------------------------------------ microphone
    async def _reset_vad(self, effect: ResetVad, origin: Origin | None) -> None:
        vad = self.voice.vad
        self._vad = vad.open_stream() if effect.on and vad is not None else None

    async def _detect(self, effect: DetectSpeech, origin: Origin | None) -> None:
        """Judge the audio for speech, in its lane."""
        vad = self.voice.vad
        if vad is None or self._vad is None:
            return
        try:
            probabilities = await vad.probabilities(self._vad, effect.pcm16)
        except SpeechError as exc:
            log.warning("voice activity detection failed: %s", exc)
            await self.report(SessionError(ErrorCode.INTERNAL_ERROR, "turn detection failed on this audio"), origin)
            return
        await self.result(SpeechDetected(probabilities), origin)

    async def _listen_start(self, effect: ListenStart, origin: Origin | None) -> None:
        await self._stop_listening(StopListening(), origin)
        transcriber = self.voice.transcriber
        assert transcriber is not None
        listening = Listening(transcriber.open_stream(), effect.start, self.core.limits.max_audio_bytes)
        await self._tg.start(listening.run)
        self._listening = listening

    async def _listen_feed(self, effect: ListenFeed, origin: Origin | None) -> None:
        if self._listening is not None:
            self._listening.add(effect.pcm16, effect.end)

    async def _stop_listening(self, effect: StopListening, origin: Origin | None) -> None:
        listening, self._listening = self._listening, None
        if listening is not None:
            await listening.cancel()

    def _take_listening(self) -> Listening | None:
        listening, self._listening = self._listening, None
        return listening

    async def _words(self, pcm: bytes, listening: Listening | None, name: str) -> str:
        """The words of a question's audio ``pcm``; the transcription that ran while it was
        spoken finishes with what it has not seen. Raises ``transcription_failed``."""
        transcriber = self.voice.transcriber
        assert transcriber is not None
        if listening is None:
            listening = Listening(transcriber.open_stream(), 0, len(pcm) + 2)
            await self._tg.start(listening.run)
        try:
            seen = (listening.fed - listening.start) * 2
            listening.add(pcm[seen:], listening.start + len(pcm) // 2, bounded=False)
            return await listening.finish()
        except SpeechError as exc:
            log.warning("transcription failed for %s: %s", name, exc)
            raise SessionError(ErrorCode.TRANSCRIPTION_FAILED, "the spoken question could not be transcribed") from None
        finally:
            with anyio.CancelScope(shield=True):
                await listening.cancel()

    async def _transcribe_held(self, effect: TranscribeHeld, origin: Origin | None) -> None:
        """A held spoken input's words, in its lane."""
        listening = self._take_listening() if effect.take_listening else None
        try:
            transcript = await self._words(effect.pcm16, listening, f"spoken item {effect.item_id}")
        except SessionError as exc:
            await self.report(exc, origin)
            return
        await self.result(HeldTranscribed(effect.item_id, transcript), origin)

    _RUN: dict[type, Callable[[Executor, object, Origin | None], Awaitable[None]]] = {
        Send: _do_send, Tally: _tally, Prepare: _prepare, Prefill: _prefill, Check: _check,
        StartAnswer: _start_answer, Speak: _speak, Stop: _stop, DetectSpeech: _detect, ResetVad: _reset_vad,
        ListenStart: _listen_start, ListenFeed: _listen_feed, StopListening: _stop_listening,
        TranscribeHeld: _transcribe_held, Timer: _timer, EndSession: _end_session, Generate: _stray,
        KeepMoment: MemoryJobs._keep, KeepNote: MemoryJobs._keep, KeepCaption: MemoryJobs._keep,
        Caption: MemoryJobs._caption, Recall: MemoryJobs._recall,
        FindMemory: MemoryJobs._find_memory, LoadMoments: MemoryJobs._load_moments,
        ForgetMemory: MemoryJobs._forget_memory,
    }
