"""A session with no socket: the same core and executor as a client's session, fed by a source."""

from __future__ import annotations

import json

import anyio
import pytest

from handlers.core import events as ev
from handlers.core.events import Event
from handlers.core.negotiation import Limits
from handlers.session.sourced import SourcedSession
from handlers.wire.protocol import SessionConfig, parse_client_event
from tests.protocol_client import b64, jpeg_frame
from tests.scripted import ScriptedEngine, image_keys

pytestmark = pytest.mark.anyio

LIMITS = Limits(max_frame_bytes=1_000_000, max_audio_bytes=100_000, max_queue=16, idle_timeout_s=5,
                max_history_turns=4, max_answer_tokens=64, min_check_interval_ms=0)


def event(**message: object) -> object:
    return parse_client_event(json.dumps(message))


async def run(engine: ScriptedEngine, messages: list[object], **config: object) -> list[Event]:
    """Run a sourced session over ``messages``; returns every event it delivered."""
    delivered: list[Event] = []

    async def deliver(e: Event) -> None:
        delivered.append(e)

    async def source():
        for message in messages:
            yield message
            await anyio.sleep(0)

    session = SourcedSession(engine, LIMITS, SessionConfig(**config), deliver)
    with anyio.fail_after(10):
        await session.run(source())
    return delivered


async def test_frames_and_a_question_from_a_source_get_an_answer() -> None:
    """No transport at all: frames then a question come from a source, and the session answers
    over those frames (acks, the answer's events, goodbye) with its prefix warmed first."""
    engine = ScriptedEngine(words=["a red ", "cup"])
    frames = [event(type="video.frame", data=b64(jpeg_frame(seed)), frame_id=f"f{seed}") for seed in range(3)]
    out = await run(engine, [*frames, event(type="video.query", text="what is here?"), event(type="video.done")])
    types = [type(e).__name__ for e in out]
    assert types[0] == "SessionReady" and types[-1] == "SessionDone"
    assert types.count("FrameAcked") == 3
    answer = types[types.index("AnswerStarted"):types.index("AnswerEnded") + 1]
    assert answer == ["AnswerStarted", "FramesConsumed", "AnswerTextDelta", "AnswerTextDelta",
                      "AnswerTextDone", "AnswerEnded"]
    done = next(e for e in out if isinstance(e, ev.AnswerEnded))
    assert done.status == "completed"
    assert "".join(e.delta for e in out if isinstance(e, ev.AnswerTextDelta)) == "a red cup"
    assert len(image_keys(engine.requests[0])) == 3 and engine.prefills  # over every frame, warmed first


async def test_a_source_that_runs_dry_ends_the_session_after_its_answer() -> None:
    """Without video.done, the session ends once the source is exhausted and the answer ended."""
    engine = ScriptedEngine(words=["ok"], step_s=0.01)
    out = await run(engine, [event(type="video.frame", data=b64(jpeg_frame(1)), frame_id=1),
                             event(type="video.query", text="and now?")])
    assert [type(e).__name__ for e in out][-1] == "AnswerEnded" and out[-1].status == "completed"
    assert not engine.running


async def test_a_watch_fires_in_a_session_without_a_socket() -> None:
    """A watch checked at every frame fires and is answered unasked, with no client connected."""
    engine = ScriptedEngine(words=["red"], yes=lambda key, question: 0.99)
    out = await run(engine, [event(type="video.frame", data=b64(jpeg_frame(1)), frame_id=1)],
                    watches=[{"watch_id": "red", "condition": "Is the screen red?", "mode": "alert"}])
    types = [type(e).__name__ for e in out]
    assert "WatchFired" in types and types.index("WatchFired") < types.index("AnswerStarted")
