"""Embedded transcription: PocketSphinx with the US English model its wheel ships.

A fixed pool of decoders (each ~1 s to load) serves all sessions, one utterance per decoder
at a time. An utterance is streamed: audio is recognised as it arrives, so the words are
ready about when the speech stops. Streaming uses a decoder only while it is free: a
question that was asked and waits for a decoder takes it from a stream still listening,
which starts over when it is asked in turn.

PocketSphinx holds the GIL while it recognises, so the event loop (and every other session)
would wait for a whole call: audio goes in 10 ms steps (one feature frame each), with a
cancellation check between steps, so neither a ``ping`` of another session nor a cancel
waits more than one step. The second search passes (``fwdflat``, ``bestpath``) are off:
they run at the end of an utterance, over all of it, in one call (0.1-0.7 s for 10 s of
speech here, holding the GIL throughout). Ending an utterance still costs one call of
40-150 ms here; a cancelled utterance is left open and ended by the next stream that takes
its decoder, in that stream's first step, so a cancel never waits for it.

PocketSphinx's feature normalisation fails on digital silence (synthesized or gated audio):
a faint, seeded noise floor is added first, well below any microphone's own.
"""

from __future__ import annotations

import logging
import queue

import anyio
import numpy as np

from handlers import blocking
from server.speech.base import SpeechError, Transcriber, TranscriptStream

log = logging.getLogger("livesight.speech")

#: Standard deviation of the added noise floor, in PCM16 steps (about -61 dBFS).
NOISE_FLOOR = 30.0
#: Samples recognised per step (10 ms at 16 kHz: one feature frame).
STEP_SAMPLES = 160
#: Under this much audio (0.1 s) there is nothing to recognise.
MIN_SAMPLES = 1600
#: Loudness (RMS, PCM16 steps; about -40 dBFS) under which an utterance is taken for silence
#: or noise: its feature statistics are not carried to the next utterance.
SPEECH_RMS = 300.0


class PocketsphinxTranscriber(Transcriber):
    """PocketSphinx, US English, offline."""

    name = "pocketsphinx"

    def __init__(self, decoders: int = 1) -> None:
        self.size = decoders
        self._pool: queue.SimpleQueue[_Decoder] = queue.SimpleQueue()
        self._decoders: anyio.CapacityLimiter | None = None  # held by a stream for its utterance
        self._threads: anyio.CapacityLimiter | None = None  # one recognition step at a time per decoder

    async def start(self) -> None:
        self._decoders = anyio.CapacityLimiter(self.size)
        self._threads = anyio.CapacityLimiter(self.size)
        calibration = await blocking.run_blocking(_calibration_speech, limiter=self._threads)
        for _ in range(self.size):
            decoder = await blocking.run_blocking(_load, limiter=self._threads)
            await blocking.run_blocking(_calibrate, decoder, calibration, limiter=self._threads)
            self._pool.put(_Decoder(decoder))

    def open_stream(self) -> TranscriptStream:
        if self._decoders is None or self._threads is None:
            raise SpeechError("the transcriber is not started")
        return PocketsphinxStream(self._pool, self._decoders, self._threads)

    async def transcribe(self, pcm16: bytes) -> str:
        stream = self.open_stream()
        try:
            await stream.feed(pcm16)
            return await stream.finish()
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()


class PocketsphinxStream(TranscriptStream):
    """One utterance, recognised on a pooled decoder while one is free.

    ``feed`` takes a decoder only when one is free at once, and gives it back as soon as a
    finishing stream (a question that was asked) waits for one: a session that streams audio
    and never asks cannot starve the others. The audio is kept (the session bounds it), so a
    stream that had no decoder, or lost it, recognises what is left in ``finish``.
    """

    def __init__(
        self, pool: queue.SimpleQueue[_Decoder], decoders: anyio.CapacityLimiter, threads: anyio.CapacityLimiter
    ) -> None:
        self._pool = pool
        self._decoders = decoders
        self._threads = threads
        self._decoder: _Decoder | None = None
        self._audio = bytearray()  # every whole sample fed
        self._done = 0  # bytes of it recognised on the decoder held now
        self._energy = 0.0  # sum of squared samples recognised on it
        self._odd = b""
        self._rng = np.random.default_rng(0)

    def _hold(self) -> None:
        self._decoder = self._pool.get_nowait()
        self._done = 0
        self._energy = 0.0

    def _release(self) -> None:
        pooled, self._decoder = self._decoder, None
        if pooled is not None:
            pooled.ours = False  # an open utterance is ended by the next stream (see the module notes)
            self._pool.put(pooled)
            self._decoders.release_on_behalf_of(self)

    async def feed(self, pcm16: bytes) -> None:
        data, self._odd = _even(self._odd + pcm16)
        self._audio.extend(data)
        if self._decoder is None:
            try:
                self._decoders.acquire_on_behalf_of_nowait(self)
            except anyio.WouldBlock:
                return  # every decoder is busy: this audio is recognised in finish
            self._hold()
        elif self._decoders.statistics().tasks_waiting:
            self._release()  # an asked question waits for a decoder: it goes first
            return
        await self._catch_up()

    async def _catch_up(self) -> None:
        if len(self._audio) > self._done:
            pending = bytes(self._audio[self._done :])
            await blocking.run_blocking(self._feed_sync, self._decoder, pending, limiter=self._threads)

    def _feed_sync(self, pooled: _Decoder, pcm16: bytes) -> None:
        """Blocking: recognise ``pcm16`` step by step; stops between steps when cancelled."""
        samples = np.frombuffer(pcm16, "<i2").astype(np.float32)
        self._energy += float(np.dot(samples, samples))
        samples += self._rng.normal(0.0, NOISE_FLOOR, len(samples)).astype(np.float32)
        audio = np.clip(samples, -32768, 32767).astype("<i2").tobytes()
        decoder = pooled.decoder
        try:
            if not pooled.ours:
                if pooled.in_utterance:  # a cancelled stream's utterance: end it first
                    _end_quietly(decoder)
                decoder.set_cmn(pooled.cmn)  # as the last completed utterance left it
                decoder.start_utt()
                pooled.in_utterance = pooled.ours = True
            step = STEP_SAMPLES * 2
            for at in range(0, len(audio), step):
                blocking.cancel_point()
                decoder.process_raw(audio[at : at + step], full_utt=False)
                self._done += len(audio[at : at + step])
        except RuntimeError as exc:
            raise SpeechError(f"PocketSphinx failed: {exc}") from exc

    async def finish(self) -> str:
        if len(self._audio) < MIN_SAMPLES * 2:
            return ""
        if self._decoder is None:
            await self._decoders.acquire_on_behalf_of(self)
            self._hold()
        await self._catch_up()
        return await blocking.run_blocking(self._end_sync, self._decoder, limiter=self._threads)

    def _end_sync(self, pooled: _Decoder) -> str:
        try:
            pooled.decoder.end_utt()
            pooled.in_utterance = False
            if self._energy / max(1, self._done // 2) > SPEECH_RMS**2:
                pooled.cmn = pooled.decoder.get_cmn(False)
            hyp = pooled.decoder.hyp()
        except RuntimeError as exc:
            raise SpeechError(f"PocketSphinx failed: {exc}") from exc
        return "" if hyp is None else " ".join(w for w in hyp.hypstr.split() if not w.startswith("<"))

    async def aclose(self) -> None:
        self._release()
        self._audio = bytearray()


class _Decoder:
    """A pooled decoder and whether an utterance is open on it (``ours``: by the stream
    that holds it now)."""

    def __init__(self, decoder: object) -> None:
        self.decoder = decoder
        self.in_utterance = False
        self.ours = False
        # Live feature normalisation carries its estimate from one utterance to the next; an
        # utterance that was cut short (cancelled, or handed over) or held no speech must not
        # skew the next, so each starts from the estimate of the last completed spoken one.
        self.cmn = decoder.get_cmn(False)


def _even(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut to whole samples, and the odd byte left over."""
    cut = len(data) - len(data) % 2
    return data[:cut], data[cut:]


def _end_quietly(decoder: object) -> None:
    """End an abandoned utterance so the decoder can start another."""
    try:
        decoder.end_utt()
    except RuntimeError:
        pass  # the decoder had no utterance running after all: it is ready either way


def _load() -> object:
    try:
        from pocketsphinx import Decoder
    except ImportError as exc:
        raise SpeechError("the pocketsphinx package is not installed") from exc
    try:
        return Decoder(loglevel="FATAL", fwdflat=False, bestpath=False)
    except (RuntimeError, ValueError) as exc:
        raise SpeechError(f"PocketSphinx could not load its model: {exc}") from exc


#: Spoken once through each decoder at start-up (eSpeak NG, bundled): live feature
#: normalisation starts from a speech estimate, so a fresh server's first question is not
#: misheard (the model's built-in estimate made "what is on the table" "forty on that any wolf").
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


def _calibrate(decoder: object, pcm16: bytes) -> None:
    """Blocking: recognise ``pcm16`` once, so the decoder's normalisation has seen speech."""
    if not pcm16:
        return
    samples = np.frombuffer(pcm16, "<i2").astype(np.float32)
    samples += np.random.default_rng(0).normal(0.0, NOISE_FLOOR, len(samples)).astype(np.float32)
    decoder.start_utt()
    decoder.process_raw(np.clip(samples, -32768, 32767).astype("<i2").tobytes(), full_utt=True)
    decoder.end_utt()
