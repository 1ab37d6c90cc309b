"""Audio formats of the Realtime protocol, to and from the core's.

Realtime clients send and receive raw samples in ``audio/pcm`` (PCM16, 24 kHz), ``audio/pcmu``
(G.711 mu-law, 8 kHz) or ``audio/pcma`` (G.711 A-law, 8 kHz). G.711 is this module's; the
PCM16 conversion to and from the core's audio is every codec's (``handlers/wire/audio.py``).
"""

from __future__ import annotations

import base64

import numpy as np

from handlers.media.preparation import decode_base64
from handlers.wire.audio import microphone_audio, speaker_audio
from handlers.wire.errors import ErrorCode
from server.speech.wav import OUTPUT_RATE

RATES = {"audio/pcm": OUTPUT_RATE, "audio/pcmu": 8000, "audio/pcma": 8000}


def _mulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + 0x84 << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (a >> 4) & 0x07
    mantissa = a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


_DECODE = {"audio/pcmu": _mulaw_table(), "audio/pcma": _alaw_table()}
# For encoding: the code levels sorted, so each sample finds its nearest level.
_ENCODE = {
    name: (np.sort(table).astype(np.int32), np.argsort(table, kind="stable").astype(np.uint8))
    for name, table in _DECODE.items()
}


def g711_decode(data: bytes, fmt: str) -> bytes:
    """G.711 bytes (``audio/pcmu`` or ``audio/pcma``) as PCM16 little-endian."""
    return _DECODE[fmt][np.frombuffer(data, np.uint8)].astype("<i2").tobytes()


def g711_encode(pcm16: bytes, fmt: str) -> bytes:
    """PCM16 little-endian as G.711 bytes, each sample at its nearest code level."""
    levels, codes = _ENCODE[fmt]
    x = np.frombuffer(pcm16, "<i2").astype(np.int32)
    hi = np.clip(np.searchsorted(levels, x), 1, len(levels) - 1)
    nearer_low = (x - levels[hi - 1]) <= (levels[hi] - x)
    return codes[np.where(nearer_low, hi - 1, hi)].tobytes()


def audio_in(data: str, fmt: str) -> str:
    """A client's base64 audio chunk as the core's (base64 PCM16, 16 kHz).

    Raises ``SessionError`` ``invalid_audio`` for bad base64 or an odd PCM16 byte count.
    """
    raw = decode_base64(data, ErrorCode.INVALID_AUDIO, "audio")
    if fmt in _DECODE:
        raw = g711_decode(raw, fmt)
    return microphone_audio(raw, RATES[fmt])


def audio_out(wav_base64: str, fmt: str) -> str:
    """One of the core's WAV deltas (base64) as base64 raw audio in ``fmt`` (no header).

    Raises ``ValueError`` when it is not base64 of a PCM16 WAV file.
    """
    pcm = speaker_audio(wav_base64, RATES[fmt])
    if fmt in _ENCODE:
        pcm = g711_encode(pcm, fmt)
    return base64.b64encode(pcm).decode("ascii")
