"""The core's audio as other wire protocols carry it: raw PCM16 at the protocol's rate.

The core hears base64 PCM16 at 16 kHz (``audio.chunk``) and speaks WAV files (PCM16, 24 kHz,
``response.output_audio.delta``). The Realtime and Live codecs send and take raw samples
instead; both convert here (Realtime adds G.711 on top: ``handlers/realtime/audio.py``).
Each chunk is converted by itself (a polyphase filter per chunk: chunk edges are not
blended, which voice activity detection and transcription do not notice).
"""

from __future__ import annotations

import base64

from handlers.wire.errors import ErrorCode, SessionError
from server.speech.wav import INPUT_RATE, Pcm, parse_wav, resample


def microphone_audio(pcm16: bytes, rate: int) -> str:
    """Raw PCM16 little-endian at ``rate`` as the core's microphone audio (base64 PCM16, 16 kHz).

    Raises ``SessionError`` ``invalid_audio`` for an odd byte count.
    """
    if len(pcm16) % 2:
        raise SessionError(ErrorCode.INVALID_AUDIO, "PCM16 audio must have an even number of bytes")
    return base64.b64encode(resample(Pcm(pcm16, rate), INPUT_RATE).samples).decode("ascii")


def speaker_audio(wav_base64: str, rate: int) -> bytes:
    """One of the core's audio deltas (base64 of a WAV file) as raw PCM16 at ``rate``.

    Raises ``ValueError`` when it is not base64 of a PCM16 WAV file.
    """
    return resample(parse_wav(base64.b64decode(wav_base64)), rate).samples
