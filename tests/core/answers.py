"""One answer run as data, in the spirit of Pipecat's ``run_test(processor, frames_in,
frames_out)``: engine outputs in, the answer's wire events out, through the core's own calls
(``SessionCore.ask``, ``Answer.start``, ``query_prompt``, ``Answer.output``/``audio_out``,
``end_answer``), the order the session adapter makes them in. No socket, engine or clock."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from handlers.core.answer import Answer, Outcome
from handlers.core.session_core import SessionCore
from handlers.wire.protocol import ServerEvent
from server.engines.base import EngineEvent, Finished, Prompt, TextDelta, Usage


@dataclass(frozen=True)
class Speech:
    """A piece of the answer's speech sent to the client: a 24 kHz WAV saying ``words``."""

    wav: bytes
    words: str = ""


@dataclass(frozen=True)
class Ran:
    """What running an answer gave: the events it sent, in order, and the prompt it was asked with."""

    events: list[ServerEvent]
    prompt: Prompt

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]


def run_answer(
    core: SessionCore, answer: Answer, outputs: Iterable[EngineEvent | Speech] = (), *, stop: str | None = None,
    error_code: str | None = None, received: float = 0.0, step_s: float = 0.01,
) -> Ran:
    """Ask ``core`` for ``answer``, start it, make its prompt, feed ``outputs`` (engine
    events, and ``Speech`` sent), then end it: failed with ``error_code`` when given, else
    interrupted when ``stop`` names a cause (``Answer.stop``), else completed (``outputs``
    then end with ``Finished``). Each output comes ``step_s`` after the one before."""
    now = received
    core.ask(answer, received)
    core.settle_frames(answer)
    events = answer.start()
    prompt = core.query_prompt(answer)
    for out in outputs:
        now += step_s
        if isinstance(out, Speech):
            events += answer.audio_out(out.wav, now, out.words)
        else:
            events += answer.output(out, now)
    if stop is not None:
        answer.stop(stop)
    if error_code is not None:
        outcome = Outcome.FAILED
    else:
        outcome = Outcome.INTERRUPTED if stop is not None else Outcome.COMPLETED
    events += core.end_answer(answer, outcome, now + step_s, error_code)
    return Ran(events, prompt)


def answered(core: SessionCore, answer: Answer, text: str, *, stop: str | None = None) -> Ran:
    """``answer`` run to its end saying ``text`` (completed; interrupted after it when ``stop``)."""
    finished = [] if stop is not None else [Finished("stop", Usage(completion_tokens=1))]
    return run_answer(core, answer, [TextDelta(text), *finished], stop=stop)


def withdrawn(core: SessionCore, answer: Answer) -> None:
    """``answer`` asked and dropped before it started (nothing of it was sent)."""
    core.ask(answer, 0.0)
    core.withdraw(answer)
