"""The session adapter with a scripted engine: warmup, interrupts, failures, pinning, teardown."""

from __future__ import annotations

import anyio
import pytest

from handlers.core.negotiation import Limits
from handlers.core.frames import live_frame_count
from handlers.session.adapter import Session
from tests.protocol_client import b64, jpeg_frame
from tests.scripted import MemoryTransport, ScriptedEngine, image_keys, run_session

pytestmark = pytest.mark.anyio

LIMITS = Limits(
    max_frame_bytes=1 << 20, max_audio_bytes=1 << 16, max_queue=50, idle_timeout_s=30,
    max_history_turns=4, max_answer_tokens=100,
)


async def _wait(predicate, timeout: float = 5) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.005)


async def _run(engine: ScriptedEngine, body, **config) -> Session:
    return (await run_session(engine, LIMITS, body, **config))[0]


async def _frames(transport: MemoryTransport, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await transport.put(type="video.frame", data=b64(jpeg_frame(500 + i)), frame_id=i)
        await transport.get_type("video.frame.ack")


async def test_warmup_follows_frames_and_is_a_true_prefix() -> None:
    """Decoded frames are prefilled while idle; the query prompt starts with the warm prefix."""
    engine = ScriptedEngine()
    seen = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 3)
        await _wait(lambda: engine.prefills and len(image_keys(engine.prefills[-1])) == 3)
        seen.append(engine.prefills[-1])
        await t.put(type="video.query", text="what?")
        await t.until("response.done")

    await _run(engine, body)
    warm, query = seen[0], engine.requests[-1]
    assert warm.open_turn and not query.open_turn
    assert query.turns[:-1] == warm.turns[:-1]
    assert query.turns[-1].segments[: len(warm.turns[-1].segments)] == warm.turns[-1].segments


async def test_query_cancels_running_warmup() -> None:
    """A query arriving during a slow prefill cancels it and is answered."""
    engine = ScriptedEngine(prefill_s=10)

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 2)
        await _wait(lambda: engine.prefills)
        await t.put(type="video.query", text="now?")
        events = await t.until("response.done")
        assert events[-1]["status"] == "completed"

    await _run(engine, body)
    assert engine.prefills_cancelled >= 1


async def test_no_warmup_when_disabled_and_sampling_used() -> None:
    """prefix_warmup=false: no prefill, and the query holds num_frames frames, thinned, newest included."""
    engine = ScriptedEngine()

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 6)
        await t.put(type="video.query", text="q")
        events = await t.until("response.done")
        consumed = next(e for e in events if e["type"] == "video.frames.consumed")
        assert consumed["frame_ids"] == [0, 2, 4, 5]

    await _run(engine, body, prefix_warmup=False, enable_frame_filter=False)
    assert engine.prefills == []


async def test_warm_prefix_uses_all_frames_and_evicts_half() -> None:
    """With a warm prefix every buffered frame is used, and a full buffer drops half at once."""
    engine = ScriptedEngine()

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 4)
        await t.put(type="video.frame", data=b64(jpeg_frame(999)), frame_id=99)
        ack = await t.get_type("video.frame.ack")
        assert ack["dropped_frame_ids"] == [0, 1] and ack["buffered_frames"] == 3
        await t.put(type="video.query", text="q")
        events = await t.until("response.done")
        consumed = next(e for e in events if e["type"] == "video.frames.consumed")
        assert consumed["frame_ids"] == [2, 3, 99]

    await _run(engine, body, max_frames=4, enable_frame_filter=False)


async def test_interrupt_aborts_engine_request() -> None:
    """A new query interrupts: the old request is aborted in the engine before the new one starts."""
    engine = ScriptedEngine(words=["w "] * 50, step_s=0.02)

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 1)
        await t.put(type="video.query", text="first")
        first = await t.get_type("response.start")
        await t.get_type("response.text.delta")
        await t.put(type="video.query", text="second")
        done = await t.get_type("response.done")
        assert done["request_id"] == first["request_id"] and done["status"] == "interrupted"
        assert first["request_id"] in engine.aborted and not engine.running - {None}
        nxt = await t.get_type("response.start")
        assert nxt["request_id"] != first["request_id"]
        await t.put(type="response.cancel")
        assert (await t.get_type("response.done"))["status"] == "interrupted"

    await _run(engine, body)
    assert engine.running == set()


async def test_the_next_question_waits_for_the_running_answer() -> None:
    """A question while an answer streams: every event of the running answer, its
    response.done (interrupted) last, is on the wire before the next answer's response.start,
    and the engine never generates the two at once."""
    engine = ScriptedEngine(words=["w "] * 50, step_s=0.02)
    generate = engine.generate
    overlapped: list[int] = []

    async def one_at_a_time(session_id, request_id, prompt, sampling):
        overlapped.append(len(engine.running))  # generations already running when this one starts
        async for event in generate(session_id, request_id, prompt, sampling):
            yield event

    engine.generate = one_at_a_time

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 1)
        await t.put(type="video.query", text="first")
        events = await t.until("response.text.delta")
        await t.put(type="video.query", text="second")
        events += await t.until("response.done")
        events += await t.until("response.done")
        starts = [e for e in events if e["type"] == "response.start"]
        first, second = starts[0]["request_id"], starts[1]["request_id"]
        owners = [e.get("request_id") for e in events if e.get("request_id") is not None]
        switch = owners.index(second)
        assert set(owners[:switch]) == {first} and set(owners[switch:]) == {second}, owners
        kinds = [(e["type"], e.get("status")) for e in events if e.get("request_id") == first]
        assert kinds[-1] == ("response.done", "interrupted") and kinds.count(("response.done", "interrupted")) == 1
        assert events[events.index(starts[1]) - 1]["type"] == "response.done"
        assert events[-1]["status"] == "completed"

    await _run(engine, body)
    assert overlapped == [0, 0] and len(engine.aborted) == 1


async def test_engine_failure_is_reported_and_session_goes_on() -> None:
    """An engine failure gives engine_error and response.done failed; the next query works."""
    engine = ScriptedEngine(fail_next=True)

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 1)
        await t.put(type="video.query", text="q")
        events = await t.until("response.done")
        assert [e["type"] for e in events] == ["response.start", "error", "response.done"]
        assert events[1]["code"] == "engine_error" and events[-1]["status"] == "failed"
        await t.put(type="video.query", text="again")
        assert (await t.until("response.done"))[-1]["status"] == "completed"

    await _run(engine, body)


async def test_frames_pinned_by_answer_survive_eviction() -> None:
    """Frames a running answer uses stay readable when evicted (the acks name them dropped, and
    the answer, which reads them at every word, completes), and are released after it."""
    engine = ScriptedEngine(words=["x "] * 20, step_s=0.02, read_images=True)
    before = live_frame_count()

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 2)
        await t.put(type="video.query", text="q")
        await t.get_type("response.text.delta")
        dropped = []
        for i in range(10, 13):  # max_frames=2: both frames the answer uses are evicted now
            await t.put(type="video.frame", data=b64(jpeg_frame(500 + i)), frame_id=i)
            dropped += (await t.get_type("video.frame.ack"))["dropped_frame_ids"]
        events = await t.until("response.done")
        assert [str(f) for f in dropped[:2]] == ["0", "1"], dropped
        assert events[-1]["status"] == "completed" and not [e for e in events if e["type"] == "error"], events
        await _wait(lambda: live_frame_count() == before + 2)  # only the two frames of the window

    await _run(engine, body, max_frames=2, enable_frame_filter=False, prefix_warmup=False)


async def test_session_end_leaves_nothing_behind() -> None:
    """After a hang-up mid-answer, the engine request is aborted and no frame stays alive."""
    engine = ScriptedEngine(words=["y "] * 100, step_s=0.02)
    before = live_frame_count()  # other tests' in this process (a worker runs several files)

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 3)
        await t.put(type="video.query", text="q")
        await t.get_type("response.text.delta")

    session = await _run(engine, body)
    assert session.closed and engine.running == set() and len(engine.aborted) == 1
    import gc

    gc.collect()
    assert live_frame_count() <= before


async def test_drain_deadline_interrupts_a_long_answer_and_closes_1012() -> None:
    """An answer still running at the drain deadline ends interrupted; the session closes with 1012."""
    engine = ScriptedEngine(words=["w "] * 500, step_s=0.02)
    events = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 1)
        await t.put(type="video.query", text="long?")
        await t.get_type("response.text.delta")
        with anyio.fail_after(5):
            await s.drain(0.2)
        while True:
            try:
                events.append(await t.get(1))
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                break
        assert t.closed_with == 1012 and s.closed

    await _run(engine, body)
    kinds = [e["type"] for e in events]
    assert "session.closing" in kinds and kinds[-1] == "response.done", kinds
    assert events[-1]["status"] == "interrupted"
    assert next(e for e in events if e["type"] == "session.closing")["deadline_ms"] == 200
    assert not engine.running


async def test_burst_of_questions_cancels_and_frames_gives_one_done_per_start() -> None:
    """Questions, cancels and frames in a burst while prefills run: every response.start gets one response.done, in order."""
    engine = ScriptedEngine(words=["w "] * 10, step_s=0.003, prefill_s=0.01)
    events: list[dict] = []

    async def body(t: MemoryTransport, s: Session) -> None:
        await _frames(t, 1)
        for i in range(12):
            await t.put(type="video.frame", data=b64(jpeg_frame(700 + i)), frame_id=100 + i)
            await t.put(type="video.query", text=f"q{i}")
            if i % 3 == 1:
                await t.put(type="response.cancel")
            if i % 4 == 2:
                await anyio.sleep(0.02)  # let some answers run and some prefills start
        await t.put(type="video.done")
        events.extend(await t.until("session.done", timeout=30))

    await _run(engine, body, enable_frame_filter=False)
    open_id = None
    starts = 0
    for event in events:
        if event["type"] == "response.start":
            assert open_id is None, "a start before the previous answer's end"
            open_id, starts = event["request_id"], starts + 1
        elif event["type"] == "response.done":
            assert event["request_id"] == open_id
            open_id = None
        elif event.get("request_id") is not None:
            assert event["request_id"] == open_id, event["type"]
    assert open_id is None and starts == 12
    assert {e["status"] for e in events if e["type"] == "response.done"} <= {"completed", "interrupted"}
    assert events[-1]["type"] == "session.done" and not engine.running  # nothing left answering
