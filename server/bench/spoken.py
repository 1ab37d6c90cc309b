"""Spoken questions for ``bench voice`` and the tests: eSpeak NG speech as microphone audio,
with where the speech really is, and a WAV reader for the audio the server sends back.

It imports numpy and the speech package's eSpeak and PCM helpers (eSpeak only when a clip is
spoken), never the session handlers or torch.
"""

from __future__ import annotations

import functools
import io
import wave
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from server.speech.wav import INPUT_RATE, OUTPUT_RATE, Pcm, resample

if TYPE_CHECKING:
    from server.speech.espeak import EspeakSynthesizer


@dataclass(frozen=True)
class SpokenClip:
    """A question spoken by eSpeak NG: 16 kHz PCM16 with silence around it, and where the
    speech really is (first and last sample above 2% of the peak)."""

    text: str
    pcm16: bytes
    speech_start_ms: float
    speech_end_ms: float

    @property
    def duration_ms(self) -> float:
        return len(self.pcm16) / 2 * 1000 / INPUT_RATE


@functools.cache
def espeak() -> EspeakSynthesizer:
    """One loaded eSpeak NG synthesizer for this process. Raises ``SpeechError`` when the
    library cannot be loaded."""
    from server.speech.espeak import EspeakSynthesizer

    synth = EspeakSynthesizer()
    synth.load()
    return synth


def speak_clip(
    text: str, *, lead_ms: float = 600, tail_ms: float = 900, noise: float = 0.0, seed: int = 0,
    voice: str = "en-us", rate: float = 1.0,
) -> SpokenClip:
    """``text`` spoken by eSpeak NG as microphone audio; ``noise`` adds a Gaussian floor (PCM steps)."""
    speech = resample(Pcm(espeak().speak_sync(text, voice, rate), OUTPUT_RATE), INPUT_RATE).samples
    x = np.frombuffer(speech, "<i2").astype(np.float32)
    active = np.nonzero(np.abs(x) > 0.02 * np.abs(x).max())[0]
    lead, tail = int(INPUT_RATE * lead_ms / 1000), int(INPUT_RATE * tail_ms / 1000)
    y = np.concatenate([np.zeros(lead, np.float32), x, np.zeros(tail, np.float32)])
    if noise:
        y += np.random.default_rng(seed).normal(0.0, noise, len(y)).astype(np.float32)
    pcm = np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()
    ms = 1000 / INPUT_RATE
    return SpokenClip(text, pcm, (lead + active[0]) * ms, (lead + active[-1] + 1) * ms)


def wav_info(data: bytes) -> tuple[int, int, int, int, int]:
    """(rate, channels, sample width, frames, data bytes) of a WAV file read with ``wave``.
    Raises ``wave.Error`` for an invalid file."""
    with wave.open(io.BytesIO(data)) as w:
        frames = w.getnframes()
        payload = w.readframes(frames)
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), frames, len(payload)
