"""Embedded transcription: PocketSphinx with the US English model its wheel ships.

A fixed pool of decoders (each ~1 s to load) serves all sessions, one utterance per decoder
at a time, in worker threads bounded by the pool size. PocketSphinx's feature normalisation
fails on digital silence (synthesized or gated audio): a faint, seeded noise floor is added
first, well below any microphone's own.
"""

from __future__ import annotations

import queue

import anyio
import numpy as np

from handlers import blocking
from server.speech.base import SpeechError, Transcriber

#: Standard deviation of the added noise floor, in PCM16 steps (about -61 dBFS).
NOISE_FLOOR = 30.0


class PocketsphinxTranscriber(Transcriber):
    """PocketSphinx, US English, offline."""

    name = "pocketsphinx"

    def __init__(self, decoders: int = 1) -> None:
        self.size = decoders
        self._pool: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._limiter: anyio.CapacityLimiter | None = None

    async def start(self) -> None:
        self._limiter = anyio.CapacityLimiter(self.size)
        for _ in range(self.size):
            self._pool.put(await blocking.run_blocking(_load, limiter=self._limiter))

    async def transcribe(self, pcm16: bytes) -> str:
        if self._limiter is None:
            raise SpeechError("the transcriber is not started")
        # An interrupted question need not wait for its decoder: the thread finishes alone and
        # puts the decoder back in the pool.
        return await blocking.run_blocking(self.transcribe_sync, pcm16, limiter=self._limiter, abandon_on_cancel=True)

    def transcribe_sync(self, pcm16: bytes) -> str:
        """Blocking: the words in 16 kHz PCM16 audio, lower case."""
        if len(pcm16) < 3200:  # under 0.1 s: nothing to recognise
            return ""
        samples = np.frombuffer(pcm16[: len(pcm16) - len(pcm16) % 2], "<i2").astype(np.float32)
        samples += np.random.default_rng(len(samples)).normal(0.0, NOISE_FLOOR, len(samples)).astype(np.float32)
        audio = np.clip(samples, -32768, 32767).astype("<i2").tobytes()
        decoder = self._pool.get()
        try:
            decoder.start_utt()
            decoder.process_raw(audio, full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
        except RuntimeError as exc:
            raise SpeechError(f"PocketSphinx failed: {exc}") from exc
        finally:
            self._pool.put(decoder)
        return "" if hyp is None else " ".join(w for w in hyp.hypstr.split() if not w.startswith("<"))


def _load() -> object:
    try:
        from pocketsphinx import Decoder
    except ImportError as exc:
        raise SpeechError("the pocketsphinx package is not installed") from exc
    try:
        return Decoder(loglevel="FATAL")
    except (RuntimeError, ValueError) as exc:
        raise SpeechError(f"PocketSphinx could not load its model: {exc}") from exc
