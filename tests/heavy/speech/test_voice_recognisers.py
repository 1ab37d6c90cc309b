"""PocketSphinx recognisers run as worker processes shared by every session: no utterance
inherits another's feature normalisation, a broken recogniser is replaced, and none outlives
the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import numpy as np
import psutil
import pytest

from server.background import RunningServer, run_server
from server.bench.spoken import speak_clip
from server.settings import Settings
from server.speech.base import SpeechError
from server.speech.pocketsphinx_asr import PocketsphinxTranscriber
from tests.protocol_client import b64, connect

pytestmark = pytest.mark.anyio

QUESTIONS = ["what is on the kitchen table", "how many people are in the room", "is the front door open"]


def _clips() -> list[bytes]:
    return [speak_clip(q, lead_ms=300, tail_ms=300, noise=30, seed=i).pcm16 for i, q in enumerate(QUESTIONS)]


def _loud_noise(seconds: float = 3.0) -> bytes:
    """White noise at about -12 dBFS: what a microphone next to a fan or in the wind sends."""
    noise = np.random.default_rng(1).normal(0.0, 8000.0, int(16_000 * seconds))
    return np.clip(noise, -32768, 32767).astype("<i2").tobytes()


def _words_heard(question: str, heard: str) -> int:
    return sum(word in heard.split() for word in question.split())


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _recognisers() -> list[psutil.Process]:
    """This process's recogniser children (running, not reaped zombies)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "sphinx_worker" in " ".join(child.cmdline()) and _running(child):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


async def test_noise_in_one_session_does_not_spoil_another_sessions_words(server: RunningServer) -> None:
    """Session A asks a spoken question that is loud noise; session B's spoken questions on the
    same recogniser are then heard about as well as on a fresh one (the noise's feature
    normalisation carried into the next utterance: 4 of 16 words instead of 14)."""
    clips = _clips()
    fresh = PocketsphinxTranscriber(1)
    await fresh.start()
    try:
        expected = [_words_heard(q, await fresh.transcribe(c)) for q, c in zip(QUESTIONS, clips)]
    finally:
        await fresh.close()

    noisy, _ = await connect(server, sampling={"max_tokens": 2})
    other, _ = await connect(server, sampling={"max_tokens": 2})
    heard = []
    try:
        await noisy.frame(1)
        await other.frame(1)
        for question, clip in zip(QUESTIONS, clips):
            await noisy.send(type="video.query", text="", audio_data=b64(_loud_noise()))
            assert (await noisy.recv_type("response.done", 120))["status"] in ("completed", "failed")
            await other.send(type="video.query", text="", audio_data=b64(clip))
            heard.append((await other.recv_type("input_audio.transcript", 120))["transcript"])
            await other.recv_type("response.done", 120)
    finally:
        await noisy.ws.close()
        await other.ws.close()
    got = [_words_heard(q, h) for q, h in zip(QUESTIONS, heard)]
    print(f"words heard: fresh recogniser {expected}, after another session's noise {got}: {heard}")
    assert sum(expected) >= 8  # the comparison means something
    assert sum(got) >= sum(expected) - 2, (expected, got, heard)


async def test_a_dead_recogniser_is_replaced() -> None:
    """A recogniser process that died fails the utterance it was serving, and the next
    utterance gets a fresh one that hears it."""
    transcriber = PocketsphinxTranscriber(1)
    await transcriber.start()
    clip = _clips()[0]
    try:
        (pid,) = transcriber.pids
        os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(60):
            for _ in range(2):  # the first may see it die; the second must not
                try:
                    heard = await transcriber.transcribe(clip)
                    break
                except SpeechError as exc:
                    print(f"the utterance on the dead recogniser failed: {exc}")
        assert _words_heard(QUESTIONS[0], heard) >= 3, heard
        assert transcriber.pids and transcriber.pids[0] != pid
    finally:
        await transcriber.close()
    assert not transcriber.pids


def test_a_stopped_server_leaves_no_recogniser(tiny_model_dir: Path) -> None:
    """Stopping the server ends every recogniser process it started."""
    before = {p.pid for p in _recognisers()}
    settings = Settings(model=str(tiny_model_dir), max_sessions=4, resume_grace_s=0, transcription_workers=2)
    with run_server(settings):
        started = [p for p in _recognisers() if p.pid not in before]
        assert len(started) == 2, started
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, alive


def test_recognisers_exit_when_the_server_process_is_killed() -> None:
    """A server killed outright (no shutdown) leaves no recogniser behind: each exits when its
    pipe closes."""
    script = textwrap.dedent(
        """
        import anyio, sys
        from server.speech.pocketsphinx_asr import PocketsphinxTranscriber

        async def main():
            transcriber = PocketsphinxTranscriber(2)
            await transcriber.start()
            print(*transcriber.pids, flush=True)
            await anyio.sleep(600)

        anyio.run(main)
        """
    )
    root = Path(__file__).resolve().parents[3]
    server = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        recognisers = [psutil.Process(p) for p in pids]
        server.kill()
        server.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            running = [p for p in recognisers if _running(p)]
            if not running:
                break
            time.sleep(0.1)
        assert not running, running
    finally:
        server.kill()
        server.wait()


async def test_a_cancelled_utterance_does_not_wait_for_its_recogniser() -> None:
    """Cancelling a stream while its recogniser works on 10 s of audio returns at once (the
    recogniser stops at its next step, its reply is dropped later), and the next utterance on
    the same recogniser is heard as if nothing had happened."""
    from tests.socket.speech.test_voice_blocking import ten_seconds_of_question

    long_question, clip = ten_seconds_of_question(), _clips()[1]
    transcriber = PocketsphinxTranscriber(1)
    await transcriber.start()
    try:
        began = time.perf_counter()
        expected = await transcriber.transcribe(long_question)
        whole_s = time.perf_counter() - began
        heard_alone = await transcriber.transcribe(clip)

        stream = transcriber.open_stream()
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.feed, long_question)
            await anyio.sleep(min(0.3, whole_s / 4))
            cancelled_at = time.perf_counter()
            tg.cancel_scope.cancel()
        cancel_s = time.perf_counter() - cancelled_at
        await stream.aclose()

        assert await transcriber.transcribe(clip) == heard_alone
        assert await transcriber.transcribe(long_question) == expected
    finally:
        await transcriber.close()
    print(f"cancel {cancel_s * 1000:.1f} ms; the whole utterance {whole_s * 1000:.0f} ms")
    assert cancel_s <= 0.1 * whole_s
