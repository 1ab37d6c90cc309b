"""The core's harness, in the spirit of Pipecat's ``run_test(processor, frames_in, frames_out)``:
steps in, effects out, through the real ``SessionMachine`` with no socket, engine or clock.

A step is an input (``Read``, ``Handle``, ``FrameShed``, ``Tick``), a job's result, or one of
the shorthands below, which finish the newest job of a kind the way an executor would:
``frame`` (a client's frame, prepared for real), ``Warm`` (the newest prefill ended),
``Checks`` (the newest round of checks ended with these probabilities), ``Reply`` (the newest
answer generated text and ended), ``End`` (the newest answer ended, e.g. after a ``Stop``),
``At`` (the clock moves). ``run_core(steps)`` returns every effect, and ``said(effects)``
reads them as short words for table tests. ``run_answer`` runs an answer planned on a
``SessionCore`` through the same machine (the prompt tests' harness).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from handlers.core.answer import Answer, Outcome
from handlers.core.events import Event
from handlers.core.session_core import SessionCore
from handlers.core.effects import (
    Check,
    Checked,
    Effect,
    Ended,
    FrameShed,
    Generate,
    Generated,
    Handle,
    Now,
    Prefill,
    Prepare,
    Prepared,
    Read,
    Send,
    Spoken,
    StartAnswer,
    Stop,
    Tick,
    Timer,
    Transcribed,
    Warmed,
)
from handlers.core.jobs import CheckStep, WarmStep
from handlers.core.machine import SessionMachine, Source
from handlers.core.negotiation import MemoryPolicy
from handlers.core.negotiation import Limits, VoicePaths
from handlers.media.preparation import ImageLimits, prepare_frame
from handlers.wire.protocol import SessionConfig, VideoFrame, parse_client_event
from server.engines.base import AudioChunk, Capabilities, EngineEvent, Finished, Prompt, TextDelta, Usage
from tests.protocol_client import b64, jpeg_frame

LIMITS = Limits(
    max_frame_bytes=1_000_000, max_audio_bytes=1_000_000, max_queue=10, idle_timeout_s=5, max_history_turns=4,
    max_answer_tokens=64, min_check_interval_ms=0,
)


def machine(
    *, warm: bool = True, probabilities: bool = True, voice: VoicePaths | None = None, source: Source | None = None,
    limits: Limits = LIMITS, pace: float = 0.0, memory_policy: MemoryPolicy | None = None, **config: object,
) -> SessionMachine:
    """A configured core: an engine that keeps a warm prefix and reads token probabilities
    unless told otherwise (``pace``: its warm interval; ``memory_policy``: the server's memory,
    none by default), with ``config`` as the client's ``session.config``."""
    capabilities = Capabilities(name="x", model="m", warm_prefix=warm, token_probabilities=probabilities,
                                warm_interval_s=pace)
    core = SessionMachine("s1", limits, capabilities, voice or VoicePaths(), source, memory=memory_policy)
    core.configure(SessionConfig(**config))
    return core


def client(**message: object) -> object:
    """A client event as the v1 codec parses it (``type`` and fields)."""
    return parse_client_event(json.dumps(message))


def ask(text: str = "what is here?") -> list[object]:
    """A question as the adapter hands it to the core: read, then due in its lane."""
    event = client(type="video.query", text=text)
    return [Read(event), Handle(event)]


@dataclass(frozen=True)
class frame:  # noqa: N801 (a step, read like an input)
    """A client's frame: due in its lane, prepared for real (seed: the picture)."""

    seed: int
    frame_id: str | int | None = None


@dataclass(frozen=True)
class Warm:
    """The newest prefill ended."""


@dataclass(frozen=True)
class Checks:
    """The newest round of checks ended: probability per watch id (None: it failed or was stopped)."""

    probabilities: dict[str, float] | None


@dataclass(frozen=True)
class Reply:
    """The newest answer said ``text`` (and engine ``audio`` pieces) and ended (completed)."""

    text: str = "ok"
    audio: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class End:
    """The newest answer's job ended with ``outcome`` (interrupted: after a ``Stop``)."""

    outcome: Outcome = Outcome.INTERRUPTED
    error_code: str | None = None


@dataclass(frozen=True)
class At:
    """The clock moves to ``s`` seconds."""

    s: float


#: Every effect each core has said in this process's runs, oldest first: a later run's
#: shorthands finish the jobs an earlier run started.
_SAID: WeakKeyDictionary[SessionMachine, list[Effect]] = WeakKeyDictionary()


@dataclass
class Run:
    """What the core said in one ``run_core`` call, in order, and the core itself."""

    core: SessionMachine
    effects: list[Effect] = field(default_factory=list)

    def newest(self, kind: type) -> Effect:
        """The newest effect of ``kind`` this core has said, in any run."""
        return next(e for e in reversed(_SAID[self.core]) if isinstance(e, kind))

    def add(self, effects: list[Effect]) -> None:
        self.effects += effects
        _SAID[self.core] += effects

    @property
    def sent(self) -> list[str]:
        """The events sent, by class name, in order."""
        return [type(e.event).__name__ for e in self.effects if isinstance(e, Send)]


def run_core(steps: Iterable[object], core: SessionMachine | None = None, *, start: float = 100.0,
             step_s: float = 0.01) -> Run:
    """Feed ``steps`` to ``core`` (a fresh ``machine()`` unless given), the clock moving
    ``step_s`` each step from ``start``; returns every effect."""
    run = Run(core or machine())
    _SAID.setdefault(run.core, [])
    clock = start
    for step in steps:
        clock += step_s
        if isinstance(step, At):
            clock = step.s
            continue
        now = Now(clock, clock * 1000)
        for item in _expand(step, run, now):
            if isinstance(item, (Read, Handle, FrameShed, Tick)):
                run.add(run.core.receive(item, now))
            else:
                run.add(run.core.completed(item, now))
    return run


def _expand(step: object, run: Run, now: Now) -> list[object]:
    """The inputs and results a shorthand step stands for."""
    if isinstance(step, frame):
        data = jpeg_frame(step.seed)
        event = VideoFrame(type="video.frame", data=b64(data), frame_id=step.frame_id)
        prepare = run.core.receive(Handle(event, now.s), now)
        run.add(prepare)
        if not prepare or not isinstance(prepare[-1], Prepare):
            return []
        return [Prepared(event, prepare_frame(event.data, event.frame_id, ImageLimits(), None), now.wall_ms)]
    if isinstance(step, Warm):
        warm: WarmStep = run.newest(Prefill).step  # type: ignore[attr-defined]
        return [Warmed(warm)]
    if isinstance(step, Checks):
        round_: CheckStep = run.newest(Check).step  # type: ignore[attr-defined]
        probs = step.probabilities
        results = None if probs is None else [(wid, probs[wid], 1.0) for wid, _ in round_.prompts]
        return [Checked(round_, results)]
    if isinstance(step, Reply):
        answer = run.newest(StartAnswer).answer  # type: ignore[attr-defined]
        pieces = [Generated(answer, AudioChunk(wav)) for wav in step.audio]
        return [Generated(answer, TextDelta(step.text)), *pieces,
                Generated(answer, Finished("stop", Usage(completion_tokens=1))), Ended(answer, Outcome.COMPLETED)]
    if isinstance(step, End):
        answer = run.newest(StartAnswer).answer  # type: ignore[attr-defined]
        return [Ended(answer, step.outcome, step.error_code)]
    return [step]


@dataclass(frozen=True)
class Speech:
    """A piece of the answer's synthesized speech: a 24 kHz WAV saying ``words``."""

    wav: bytes
    words: str = ""


@dataclass(frozen=True)
class Ran:
    """What running an answer gave: the events sent, in order, and the prompt it generated from."""

    events: list[Event]
    prompt: Prompt

    @property
    def types(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


def run_answer(
    core: SessionCore, answer: Answer, outputs: Iterable[EngineEvent | Speech] = (), *, stop: str | None = None,
    error_code: str | None = None, received: float = 0.0, step_s: float = 0.01,
) -> Ran:
    """An answer planned on ``core`` (``SessionCore.plan_*``), run by the real machine over it:
    asked (its audio transcribed as silence when the engine cannot hear), then fed ``outputs`` (engine events, and ``Speech`` its speaker made), one each
    ``step_s``, then ended: failed with ``error_code`` when given, else interrupted when
    ``stop`` names a cause, else completed. Returns the events the machine sent and the
    prompt its ``StartAnswer`` carried."""
    machine = SessionMachine.over(core)
    now = received
    effects = machine.ask(answer, Now(now, now * 1000), received)
    start = next(e for e in effects if isinstance(e, StartAnswer))
    prompt = start.prompt
    if start.transcribe:  # its audio becomes words first (none heard here)
        effects += machine.completed(Transcribed(answer, ""), Now(now, now * 1000))
        prompt = next(e for e in effects if isinstance(e, Generate)).prompt
    for out in outputs:
        now += step_s
        result = Spoken(answer, out.wav, out.words) if isinstance(out, Speech) else Generated(answer, out)
        effects += machine.completed(result, Now(now, now * 1000))
    if stop is not None:
        answer.stop(stop)
    outcome = Outcome.FAILED if error_code is not None else Outcome.INTERRUPTED if stop is not None else Outcome.COMPLETED
    effects += machine.completed(Ended(answer, outcome, error_code), Now(now + step_s, (now + step_s) * 1000))
    after = effects[-1:]
    while after and isinstance(after[-1], Prefill):  # the prefills its end started, each run to its end
        after = machine.completed(Warmed(after[-1].step), Now(now + step_s, (now + step_s) * 1000))
        effects += after
    assert prompt is not None
    return Ran([e.event for e in effects if isinstance(e, Send)], prompt)


def answered(core: SessionCore, answer: Answer, text: str, *, stop: str | None = None) -> Ran:
    """``answer`` run to its end saying ``text`` (completed; interrupted after it when ``stop``)."""
    finished = [] if stop is not None else [Finished("stop", Usage(completion_tokens=1))]
    return run_answer(core, answer, [TextDelta(text), *finished], stop=stop)


def withdrawn(core: SessionCore, answer: Answer) -> None:
    """``answer`` asked and dropped before it started (nothing of it was sent)."""
    core.ask(answer, 0.0)
    core.withdraw(answer)


def said(effects: Iterable[Effect]) -> list[str]:
    """Effects as short words: ``send AnswerStarted`` (an event by its class), ``prefill``, ``check``, ``answer``,
    ``stop answer:question`` (a stopped answer and its cause), ``stop prefill``, ``timer``, ..."""
    words = []
    for effect in effects:
        if isinstance(effect, Send):
            words.append(f"send {type(effect.event).__name__}")
        elif isinstance(effect, Stop):
            job = effect.job
            what = "prefill" if isinstance(job, WarmStep) else "check" if isinstance(job, CheckStep) else "answer"
            words.append(f"stop {what}" + (f":{job.stopped_by}" if what == "answer" else ""))
        elif isinstance(effect, StartAnswer):
            words.append("answer")
        elif isinstance(effect, Timer):
            words.append("timer" if effect.at is not None else "no timer")
        elif type(effect).__name__ == "Tally":
            continue
        else:
            words.append(_snake(type(effect).__name__))
    return words


def _snake(name: str) -> str:
    return "".join(f" {c.lower()}" if c.isupper() else c for c in name).strip()
