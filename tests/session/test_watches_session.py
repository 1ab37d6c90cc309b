"""Watches through the session adapter with a scripted engine that gives scripted yes
probabilities: when checks run, what fires, what a question does to a check, and that checks
never enter the timeline."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from handlers.core.negotiation import Limits
from handlers.session.adapter import Session
from handlers.session.observer import SessionObserver
from tests.protocol_client import b64, jpeg_frame
from tests.scripted import MemoryTransport, ScriptedEngine, image_keys, run_session
from handlers.media.preparation import content_key

pytestmark = pytest.mark.anyio

LIMITS = Limits(
    max_frame_bytes=1 << 20, max_audio_bytes=1 << 16, max_queue=50, idle_timeout_s=30,
    max_history_turns=4, max_answer_tokens=100, max_watches=3, min_check_interval_ms=0,
)
GREY, RED = range(100, 110), range(200, 210)  # jpeg_frame seeds
RED_KEYS = {content_key(jpeg_frame(seed)) for seed in RED}
RED_WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 0.0, "clear": 2}


def red_engine(**fields) -> ScriptedEngine:
    return ScriptedEngine(yes=lambda key, question: 0.95 if key in RED_KEYS else 0.05, **fields)


async def run(engine: ScriptedEngine, body, limits: Limits = LIMITS, observer: SessionObserver | None = None,
              **config) -> tuple[Session, MemoryTransport]:
    return await run_session(engine, limits, body, observer, **config)


async def settle(session: Session) -> None:
    """Until the session is idle: frames acked, prefix warm, checks and answers done."""
    with anyio.fail_after(10):
        while not session.settled:
            await anyio.sleep(0.005)
        await anyio.sleep(0.02)


async def stream(t: MemoryTransport, s: Session, seeds, seen: list[dict], first_id: int) -> None:
    """Send one frame at a time, letting checks (and any fired answer) finish between frames."""
    for i, seed in enumerate(seeds):
        await t.put(type="video.frame", data=b64(jpeg_frame(seed)), frame_id=first_id + i)
        await settle(s)
        seen.extend(await t.drain())


async def test_an_alert_fires_on_red_clears_on_grey_and_fires_again() -> None:
    """Grey, red, grey, red: exactly two fires, each on the first red frame, each answered with
    a response whose start and done carry the watch as trigger, and one watch.cleared between."""
    seen: list[dict] = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await stream(t, s, [GREY[0], GREY[1]], seen, 0)
        await stream(t, s, [RED[0], RED[1]], seen, 10)
        await stream(t, s, [GREY[2], GREY[3], GREY[4]], seen, 20)
        await stream(t, s, [RED[2], RED[3]], seen, 30)

    await run(red_engine(), body, watches=[RED_WATCH])
    fired = [e for e in seen if e["type"] == "watch.fired"]
    assert [e["frame_id"] for e in fired] == [10, 30]
    assert [e["type"] for e in seen if e["type"] == "watch.cleared"] == ["watch.cleared"]
    starts = [e for e in seen if e["type"] == "response.start"]
    dones = [e for e in seen if e["type"] == "response.done"]
    assert [e["trigger"] for e in starts] == [{"type": "watch", "watch_id": "red"}] * 2
    assert [e["trigger"]["watch_id"] for e in dones] == ["red", "red"]
    kinds = [e["type"] for e in seen]
    assert kinds.index("watch.fired") < kinds.index("response.start")


async def test_a_question_preempts_a_running_check() -> None:
    """A check that takes long is stopped by a question, which is answered at once; the frame
    is checked again after the answer's response.done, and that check's result counts (the
    red frame fires)."""
    order: list[str] = []
    engine = red_engine(check_s=30)
    check, generate = engine.check, engine.generate

    async def logged_check(session_id, request_id, prompts):
        order.append("check " + ",".join(image_keys(p)[-1] for p in prompts))
        return await check(session_id, request_id, prompts)

    async def logged_generate(session_id, request_id, prompt, sampling):
        order.append("answer")
        async for event in generate(session_id, request_id, prompt, sampling):
            yield event
        order.append("answer end")

    engine.check, engine.generate = logged_check, logged_generate
    red = content_key(jpeg_frame(RED[0]))

    async def body(t: MemoryTransport, s: Session) -> None:
        await t.put(type="video.frame", data=b64(jpeg_frame(RED[0])), frame_id=1)
        with anyio.fail_after(5):
            while not engine.checks:
                await anyio.sleep(0.005)
        engine.check_s = 0  # the check running sleeps on; the next one answers at once
        await t.put(type="video.query", text="What is it?")
        answered = await t.until("response.done")
        assert answered[-1]["status"] == "completed" and answered[-1]["trigger"] is None
        assert not [e for e in answered if e["type"] == "watch.fired"]
        assert order == [f"check {red}", "answer", "answer end"]  # not checked again before the end
        fired = (await t.until("watch.fired"))[-1]
        assert (fired["watch_id"], fired["frame_id"]) == ("red", 1)
        assert (await t.until("response.done"))[-1]["trigger"] == {"type": "watch", "watch_id": "red"}

    await run(engine, body, watches=[RED_WATCH])
    assert engine.checks_cancelled == 1 and len(engine.checks) == 2
    assert order[:4] == [f"check {red}", "answer", "answer end", f"check {red}"]  # the same frame, once more


async def test_checks_never_enter_the_timeline() -> None:
    """With a watch that never fires, the question's prompt is the same as without watches."""
    prompts = []
    for watches in ([], [{"watch_id": "w", "condition": "Is anyone there?"}]):
        engine = ScriptedEngine(yes=lambda key, question: 0.0)

        async def body(t: MemoryTransport, s: Session) -> None:
            for n, seed in enumerate(GREY[:3]):  # with pts: the prompt's times do not depend on the host's speed
                await t.put(type="video.frame", data=b64(jpeg_frame(seed)), frame_id=seed, pts_ms=500 * n)
                await settle(s)
            await t.put(type="video.query", text="What changed?")
            await t.until("response.done")

        await run(engine, body, watches=watches)
        prompts.append(engine.requests[-1])
        assert bool(engine.checks) == bool(watches)
    assert prompts[0] == prompts[1]


async def test_the_follow_up_after_a_fire_holds_the_triggered_turn() -> None:
    """"What did you see?" right after a fire: its prompt holds the fired answer as an assistant
    turn, after the watch's question, and starts with the fired answer's prompt."""
    engine = red_engine()
    seen: list[dict] = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await stream(t, s, [RED[0]], seen, 0)
        await t.put(type="video.query", text="What did you see?")
        await t.until("response.done")

    await run(engine, body, watches=[RED_WATCH])
    fired_prompt, follow_up = engine.requests[-2], engine.requests[-1]
    assert follow_up.turns[: len(fired_prompt.turns) - 1] == fired_prompt.turns[:-1]
    assistant = [turn for turn in follow_up.turns if turn.role == "assistant"]
    assert assistant and assistant[-1].segments[0].text.strip() == "a b c"


async def test_watch_events_and_their_errors() -> None:
    """watch.create / .update / .delete answer watch.created / .updated / .deleted; too many,
    an unknown id and a bad field get their codes and the session goes on."""

    async def body(t: MemoryTransport, s: Session) -> None:
        await t.put(type="watch.create", condition="Is the door open?", report_checks=True)
        created = await t.get_type("watch.created")
        assert created["watch"]["watch_id"] == "w1" and created["tokens_per_check"] > 0
        await t.put(type="watch.create", watch_id="b", condition="Is it dark?")
        await t.put(type="watch.create", watch_id="c", condition="Is it raining?")
        await t.get_type("watch.created")
        await t.get_type("watch.created")
        await t.put(type="watch.create", condition="One more?")
        assert (await t.get_type("error"))["code"] == "too_many_watches"
        await t.put(type="watch.delete", watch_id="nope")
        assert (await t.get_type("error"))["code"] == "unknown_watch"
        await t.put(type="watch.update", watch_id="b", threshold="high")
        assert (await t.get_type("error"))["code"] == "invalid_watch"
        await t.put(type="watch.create", condition="")
        assert (await t.get_type("error"))["code"] == "invalid_watch"
        await t.put(type="watch.update", watch_id="b", threshold=0.9)
        assert (await t.get_type("watch.updated"))["watch"]["threshold"] == 0.9
        await t.put(type="watch.delete", watch_id="b")
        assert (await t.get_type("watch.deleted"))["watch_id"] == "b"
        await t.put(type="video.frame", data=b64(jpeg_frame(GREY[0])), frame_id=1)
        check = await t.get_type("watch.check")
        assert check["watch_id"] == "w1" and check["frame_id"] == 1 and 0 <= check["probability"] <= 1

    await run(red_engine(), body)


async def test_an_engine_without_probabilities_never_checks() -> None:
    """On an engine with no token probabilities, watches are kept but no check runs."""
    engine = ScriptedEngine()

    async def body(t: MemoryTransport, s: Session) -> None:
        await t.put(type="video.frame", data=b64(jpeg_frame(RED[0])), frame_id=1)
        await t.get_type("video.frame.ack")
        await anyio.sleep(0.1)

    await run(engine, body, watches=[RED_WATCH])
    assert not engine.checks


class CheckCounts(SessionObserver):
    """Records what the session tells its observer of its checks."""

    def __init__(self) -> None:
        self.ran = self.skipped = 0

    def checks(self, ran: int, skipped: int) -> None:
        self.ran += ran
        self.skipped += skipped


async def test_frames_no_check_looked_at_are_counted_never_queued() -> None:
    """Frames faster than ``min_check_interval_ms``: a round checks only the newest frame and
    the ones it passed over are told to the observer as skipped (the metrics' count), and so
    are the frames after the last round when the session ends; every check that ran is
    counted."""
    counts = CheckCounts()
    limits = replace(LIMITS, min_check_interval_ms=1000)
    checked: list[dict] = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await t.put(type="video.frame", data=b64(jpeg_frame(GREY[0])), frame_id=0)
        with anyio.fail_after(10):
            while counts.ran < 1:
                await anyio.sleep(0.005)
        for i in (1, 2, 3):  # within the interval: only frame 3 is checked next
            await t.put(type="video.frame", data=b64(jpeg_frame(GREY[i])), frame_id=i)
        with anyio.fail_after(10):
            while counts.ran < 2:
                await anyio.sleep(0.005)
        checked.extend(e for e in await t.drain() if e["type"] == "watch.check")

        for i in (4, 5):  # after the last round: told when the session ends
            await t.put(type="video.frame", data=b64(jpeg_frame(GREY[i])), frame_id=i)
        with anyio.fail_after(10):
            while s.frames_handled < 6:
                await anyio.sleep(0.005)

    await run(red_engine(), body, limits, counts, watches=[{**RED_WATCH, "report_checks": True}])
    assert [e["frame_id"] for e in checked] == [0, 3]
    assert counts.ran == 2 and counts.skipped == 2 + 2
