"""A spoken question is heavy work (PocketSphinx on the real server): it must neither stall
other sessions nor hold up its own cancellation."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest

from server.background import RunningServer
from server.bench.spoken import speak_clip
from tests.protocol_client import b64, Client, connect

pytestmark = pytest.mark.anyio

SENTENCES = [
    "what is on the kitchen table next to the window",
    "how many people are standing in the room right now",
    "is the front door open or closed and who opened it",
    "what colour is the car that is parked outside the house",
]


def ten_seconds_of_question() -> bytes:
    """About ten seconds of speech (eSpeak NG, with a microphone's noise floor)."""
    parts = [speak_clip(s, lead_ms=150, tail_ms=150, noise=30, seed=i).pcm16 for i, s in enumerate(SENTENCES)]
    pcm = b"".join(parts)
    while len(pcm) < 10 * 32_000:
        pcm += parts[len(pcm) % len(parts)]
    return pcm[: 10 * 32_000]


async def _pong_s(client: Client) -> float:
    started = time.perf_counter()
    await client.send(type="ping")
    await client.recv_type("pong", timeout=60)
    return time.perf_counter() - started


async def _pongs_until(client: Client, done: asyncio.Future[object]) -> list[float]:
    """Pongs, one ping at a time, until ``done``: paced under the control budget (50 a second by
    default), past which a ping gets ``rate_limited`` and no pong."""
    out = []
    while not done.done():
        out.append(await _pong_s(client))
        await asyncio.sleep(0.03)
    return out


async def test_spoken_question_does_not_stall_other_sessions(server: RunningServer) -> None:
    """While one session's 10 s spoken question is transcribed, another session's pongs come
    back within about 50 ms of their baseline (they waited 6.8-8.6 s when recognition held
    the event loop)."""
    pcm = ten_seconds_of_question()
    other, _ = await connect(server)
    speaker, _ = await connect(server, sampling={"max_tokens": 2})
    try:
        await speaker.frame(1)
        baseline = [await _pong_s(other) for _ in range(30)]
        transcript: asyncio.Future[object] = asyncio.ensure_future(speaker.recv_type("input_audio.transcript", 120))
        pinger = asyncio.ensure_future(_pongs_until(other, transcript))
        started = time.perf_counter()
        for at in range(0, len(pcm), 3200):  # 100 ms chunks, sent faster than real time
            await speaker.send(type="audio.chunk", data=b64(pcm[at : at + 3200]))
        await speaker.send(type="video.query", text="")
        heard = await transcript
        work_s = time.perf_counter() - started
        during = await pinger
        await speaker.recv_type("response.done", 120)
    finally:
        await speaker.ws.close()
        await other.ws.close()
    assert len(heard["transcript"].split()) >= 5, heard
    base, worst = statistics.median(baseline), max(during)
    print(f"transcription {work_s:.2f} s; pong baseline median {base * 1000:.1f} ms, "
          f"during: median {statistics.median(during) * 1000:.1f} ms, p90 {np.percentile(during, 90) * 1000:.1f} ms, "
          f"max {worst * 1000:.1f} ms over {len(during)} pings")
    assert len(during) >= 10
    # Generous for a shared 2-core machine: the target is +50 ms; the failure was seconds.
    assert np.percentile(during, 90) <= base + 0.15
    assert worst <= base + 1.0


async def test_cancel_stops_a_spoken_question_at_once(server: RunningServer) -> None:
    """response.cancel during the transcription of a 10 s spoken question gives
    response.done in a small fraction of the transcription's own time (it took as long as
    the transcription when recognition could not be interrupted)."""
    pcm = ten_seconds_of_question()
    client, _ = await connect(server, sampling={"max_tokens": 2})
    try:
        await client.frame(1)
        await client.send(type="video.query", text="", audio_data=b64(pcm))
        started = (await client.recv_type("response.start"))["request_id"]
        await asyncio.sleep(0.3)
        cancelled_at = time.perf_counter()
        await client.send(type="response.cancel")
        done = await client.recv_type("response.done")
        cancel_s = time.perf_counter() - cancelled_at
        assert done["request_id"] == started and done["status"] == "interrupted"

        began = time.perf_counter()
        await client.send(type="video.query", text="", audio_data=b64(pcm))
        await client.recv_type("input_audio.transcript", 120)
        transcribe_s = time.perf_counter() - began
        assert (await client.recv_type("response.done", 120))["status"] == "completed"
    finally:
        await client.ws.close()
    print(f"cancel -> response.done {cancel_s * 1000:.1f} ms; transcription {transcribe_s * 1000:.0f} ms")
    assert cancel_s <= 0.1 * transcribe_s


async def test_a_listening_stream_gives_its_decoder_to_an_asked_question() -> None:
    """With one decoder, a stream that keeps listening hands it over to a question that was
    asked (a session streaming audio forever cannot starve the others), and still gets its
    own words when it is asked later."""
    import anyio

    from server.speech.pocketsphinx_asr import PocketsphinxTranscriber

    transcriber = PocketsphinxTranscriber(1)
    await transcriber.start()
    clip = speak_clip("what is on the table", lead_ms=200, tail_ms=300, noise=30).pcm16
    listener, asker = transcriber.open_stream(), transcriber.open_stream()
    try:
        await listener.feed(clip[:16_000])  # takes the only decoder
        async with anyio.create_task_group() as tg:
            asked: list[str] = []

            async def ask() -> None:
                await asker.feed(clip)  # no decoder free: kept for finish
                asked.append(await asker.finish())
                await asker.aclose()  # done: the decoder goes back

            tg.start_soon(ask)
            await anyio.sleep(0.05)
            with anyio.fail_after(30):
                while not asked:
                    await listener.feed(b"")  # the listener goes on; it yields the decoder
                    await anyio.sleep(0.01)
        await listener.feed(clip[16_000:])
        words = "what is on the table".split()
        assert sum(w in asked[0].split() for w in words) >= 3, asked
        mine = (await listener.finish()).split()
        assert sum(w in mine for w in words) >= 3, mine
    finally:
        await listener.aclose()
        await asker.aclose()


async def test_a_question_that_cannot_start_releases_its_transcription(server: RunningServer) -> None:
    """Audio streamed before a query that gets no_frames does not keep the transcriber: the
    next spoken question, in this session or another, is transcribed."""
    clip = speak_clip("is the door open", lead_ms=300, tail_ms=300, noise=30, seed=3).pcm16
    client, _ = await connect(server, sampling={"max_tokens": 2})
    other, _ = await connect(server, sampling={"max_tokens": 2})
    try:
        for at in range(0, len(clip), 3200):
            await client.send(type="audio.chunk", data=b64(clip[at : at + 3200]))
        await client.send(type="video.query", text="")
        assert (await client.recv_type("error"))["code"] == "no_frames"
        for c in (other, client):
            await c.frame(1)
            await c.send(type="video.query", text="", audio_data=b64(clip))
            heard = await c.recv_type("input_audio.transcript", timeout=60)
            assert heard["transcript"] and heard["audio_ms"] > 1000, heard
            assert (await c.recv_type("response.done", timeout=60))["status"] == "completed"
    finally:
        await client.ws.close()
        await other.ws.close()
