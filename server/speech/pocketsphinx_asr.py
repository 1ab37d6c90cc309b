"""Embedded transcription: PocketSphinx with the US English model its wheel ships.

A fixed pool of recogniser processes (``sphinx_worker``, one decoder each, ~1 s to start)
serves all sessions, one utterance per recogniser at a time. PocketSphinx holds the GIL
while it recognises (ending an utterance alone costs 40-150 ms here), so it runs outside the
server process: the event loop only moves audio and words over pipes, and no other session's
``ping`` waits for recognition.

An utterance is streamed: audio is recognised as it arrives, so the words are ready about
when the speech stops. Streaming uses a recogniser only while it is free: a question that
was asked and waits for one takes it from a stream still listening, which starts over when
it is asked in turn.

A cancelled caller never waits for its recogniser: it sends ``ABORT`` (recognition stops
at its next step) and returns; the reply it leaves is read and dropped by the next stream
that takes the recogniser, and an utterance it left open is ended by that stream's
``BEGIN``. A recogniser that breaks (its process died, or does not read) is killed and
started again by the next stream that takes it.

Every utterance starts from the feature normalisation (CMN) that calibration left: one
eSpeak sentence recognised at start-up (the model's built-in estimate made a fresh server's
first question "forty on that any wolf"), and with a fresh noise estimate (noise removal
also adapts across utterances). Nothing carries from one utterance to the next, so one
session's noise cannot spoil another session's words.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import deque
from pathlib import Path

import anyio
from anyio.abc import Process

from server import blocking
from server.speech import sphinx_worker as wire
from server.speech.base import SpeechError, Transcriber, TranscriptStream

log = logging.getLogger("livesight.speech")

#: Under this much audio (0.1 s) there is nothing to recognise.
MIN_SAMPLES = 1600
#: Longest wait for a recogniser to take a command (it reads at once when it is well).
WRITE_TIMEOUT_S = 2.0
#: Longest wait for a recogniser to exit after its stdin closed, before it is killed.
EXIT_TIMEOUT_S = 2.0


class PocketsphinxTranscriber(Transcriber):
    """PocketSphinx, US English, offline, in ``recognisers`` worker processes."""

    name = "pocketsphinx"

    def __init__(self, recognisers: int = 1) -> None:
        self.size = recognisers
        self._workers: list[_Worker] = []
        self._pool: deque[_Worker] = deque()
        self._free: anyio.CapacityLimiter | None = None  # held by a stream for its utterance

    async def start(self) -> None:
        self._free = anyio.CapacityLimiter(self.size)
        calibration = await blocking.run_blocking(_calibration_speech, limiter=anyio.CapacityLimiter(1))
        self._workers = [_Worker(calibration) for _ in range(self.size)]
        try:
            async with anyio.create_task_group() as tg:
                for worker in self._workers:
                    tg.start_soon(worker.start)
        except BaseException:
            await self.close()
            raise
        self._pool.extend(self._workers)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            for worker in self._workers:
                await worker.stop(final=True)

    @property
    def pids(self) -> list[int]:
        """The recogniser processes running now."""
        return [w.pid for w in self._workers if w.pid is not None]

    def open_stream(self) -> TranscriptStream:
        if self._free is None:
            raise SpeechError("the transcriber is not started")
        return PocketsphinxStream(self._pool, self._free)

    async def transcribe(self, pcm16: bytes) -> str:
        stream = self.open_stream()
        try:
            await stream.feed(pcm16)
            return await stream.finish()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


class PocketsphinxStream(TranscriptStream):
    """One utterance, recognised on a pooled recogniser while one is free.

    ``feed`` takes a recogniser only when one is free at once, and gives it back as soon as
    a finishing stream (a question that was asked) waits for one: a session that streams
    audio and never asks cannot starve the others. The audio is kept (the session bounds
    it), so a stream that had none, or lost it, recognises what is left in ``finish``.
    """

    def __init__(self, pool: deque[_Worker], free: anyio.CapacityLimiter) -> None:
        self._pool = pool
        self._free = free
        self._worker: _Worker | None = None
        self._begun = False  # an utterance of ours is open on the recogniser held now
        self._audio = bytearray()  # every whole sample fed
        self._done = 0  # bytes of it recognised on the recogniser held now
        self._odd = b""

    def _hold(self) -> None:
        self._worker = self._pool.popleft()
        self._done = 0
        self._begun = False

    def _release(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            self._pool.append(worker)
            self._free.release_on_behalf_of(self)

    async def feed(self, pcm16: bytes) -> None:
        data = self._odd + pcm16
        cut = len(data) - len(data) % 2  # whole samples; an odd byte waits for the next call
        self._audio.extend(data[:cut])
        self._odd = data[cut:]
        if self._worker is None:
            try:
                self._free.acquire_on_behalf_of_nowait(self)
            except anyio.WouldBlock:
                return  # every recogniser is busy: this audio is recognised in finish
            self._hold()
        elif self._free.statistics().tasks_waiting:
            self._release()  # an asked question waits for a recogniser: it goes first
            return
        await self._catch_up()

    async def _catch_up(self) -> None:
        assert self._worker is not None
        if not self._begun:
            await self._worker.call(wire.BEGIN)
            self._begun = True
        if len(self._audio) > self._done:
            pending = bytes(self._audio[self._done :])
            await self._worker.call(wire.AUDIO, pending)
            self._done += len(pending)

    async def finish(self) -> str:
        if len(self._audio) < MIN_SAMPLES * 2:
            return ""
        if self._worker is None:
            await self._free.acquire_on_behalf_of(self)
            self._hold()
        await self._catch_up()
        assert self._worker is not None
        hyp = (await self._worker.call(wire.END)).decode("utf-8", "replace")
        self._begun = False
        return " ".join(w for w in hyp.split() if not w.startswith("<"))

    async def aclose(self) -> None:
        self._release()
        self._audio = bytearray()


class _Worker:
    """One recogniser process and the replies owed by it to cancelled callers."""

    def __init__(self, calibration: bytes) -> None:
        self._calibration = calibration
        self._process: Process | None = None
        self._buffer = bytearray()
        self._owed = 0  # commands sent and not yet answered
        self._closed = False  # the transcriber closed: never started again

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the process and calibrate it. Raises ``SpeechError``."""
        if self._closed:
            raise SpeechError("the transcriber is closed")
        script = Path(wire.__file__)
        try:
            # -P: the script's folder is not put on sys.path (its modules would shadow others).
            self._process = await anyio.open_process(
                [sys.executable, "-P", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
            )
        except OSError as exc:
            raise SpeechError(f"the speech recogniser could not start: {exc}") from exc
        self._buffer.clear()
        self._owed = 0
        if self._closed:  # closed while it started
            await self.stop()
            raise SpeechError("the transcriber is closed")
        try:
            await self.call(wire.CALIBRATE, self._calibration)
        except SpeechError:
            await self.stop()  # the next caller starts another
            raise

    async def stop(self, *, final: bool = False) -> None:
        """End the process: stdin closes (it exits), killed if it does not exit in time.
        ``final``: it is never started again."""
        self._closed = self._closed or final
        process, self._process = self._process, None
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await process.stdin.aclose()
            except (OSError, anyio.BrokenResourceError):
                pass
            with anyio.move_on_after(EXIT_TIMEOUT_S):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()

    async def call(self, kind: bytes, payload: bytes = b"") -> bytes:
        """Send one command and return its reply's payload. A cancelled caller returns at
        once (the reply is dropped later). Raises ``SpeechError`` (the recogniser failed)."""
        if self._process is None:
            await self.start()
        try:
            while self._owed:  # replies to cancelled callers
                await self._reply()
            await self._send(wire.frame(kind, payload))
            reply, body = await self._reply()
        except anyio.get_cancelled_exc_class():
            if self._owed and self._process is not None:
                try:
                    await self._send(wire.frame(wire.ABORT))  # stop its work; the reply is dropped later
                except SpeechError:
                    pass  # it does not read: it was stopped, the next caller starts another
            raise
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream) as exc:
            await self.stop()
            raise SpeechError(f"the speech recogniser failed: {exc!r}") from exc
        if reply == wire.FAILED:
            raise SpeechError(f"PocketSphinx failed: {body.decode('utf-8', 'replace')}")
        if reply != wire.OK:
            raise SpeechError(f"the speech recogniser answered {reply!r}")
        return body

    async def _send(self, data: bytes) -> None:
        """Write a whole frame (never cut by a cancel: the recogniser is reading)."""
        assert self._process is not None and self._process.stdin is not None
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(WRITE_TIMEOUT_S) as scope:
                await self._process.stdin.send(data)
            if scope.cancelled_caught:
                await self.stop()
                raise SpeechError("the speech recogniser does not read")
        if data[4:5] != wire.ABORT:
            self._owed += 1

    async def _reply(self) -> tuple[bytes, bytes]:
        """The next reply (cancel-safe: a half-read frame stays in the buffer)."""
        assert self._process is not None and self._process.stdout is not None
        while (got := wire.parse(self._buffer)) is None:
            self._buffer.extend(await self._process.stdout.receive())
        self._owed -= 1
        return got


#: Spoken once through each recogniser at start-up (eSpeak NG, bundled): every utterance
#: starts from the feature normalisation it leaves.
CALIBRATION_TEXT = "the camera sees a table, a door and two people in the room"


def _calibration_speech() -> bytes:
    """Blocking: the calibration sentence as 16 kHz PCM16 (empty if eSpeak cannot speak)."""
    from server.speech.espeak import EspeakSynthesizer
    from server.speech.wav import INPUT_RATE, OUTPUT_RATE, Pcm, resample

    synth = EspeakSynthesizer()
    try:
        synth.load()
        return resample(Pcm(synth.speak_sync(CALIBRATION_TEXT, "en-us", 1.0), OUTPUT_RATE), INPUT_RATE).samples
    except (OSError, RuntimeError, SpeechError) as exc:
        log.warning("speech recognition is not calibrated: %s", exc)
        return b""
