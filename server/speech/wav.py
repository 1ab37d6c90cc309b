"""PCM16 WAV files and sample-rate conversion: the one place audio formats are handled.

Every audio delta livesight sends is a complete WAV file, 24 kHz mono PCM16
(``OUTPUT_RATE``); microphone audio arrives as raw PCM16 at 16 kHz (``INPUT_RATE``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

OUTPUT_RATE = 24_000
INPUT_RATE = 16_000
_HEADER = struct.Struct("<4sI4s4sIHHIIHH4sI")


@dataclass(frozen=True, slots=True)
class Pcm:
    """Mono PCM16 little-endian samples at ``rate`` Hz."""

    samples: bytes
    rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / 2 / self.rate


def encode_wav(pcm16: bytes, rate: int = OUTPUT_RATE) -> bytes:
    """A complete mono PCM16 WAV file: the 44-byte RIFF header, then ``pcm16``."""
    if len(pcm16) % 2:
        raise ValueError("PCM16 data must have an even number of bytes")
    header = _HEADER.pack(
        b"RIFF", 36 + len(pcm16), b"WAVE", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16, b"data", len(pcm16)
    )
    return header + pcm16


def parse_wav(data: bytes) -> Pcm:
    """Read a PCM16 WAV file (mono, or stereo mixed down to mono).

    Streaming encoders write 0 or 0xFFFFFFFF as the data size: whatever follows the
    ``data`` tag is taken. Raises ``ValueError`` when it is not a PCM16 RIFF/WAVE file.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    offset, fmt = 12, None
    while offset + 8 <= len(data):
        tag, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        body = offset + 8
        if tag == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise ValueError("truncated fmt chunk")
            code, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, body)
            fmt = (code, channels, rate, bits)
        elif tag == b"data":
            if fmt is None:
                raise ValueError("data chunk before fmt chunk")
            code, channels, rate, bits = fmt
            if code not in {1, 0xFFFE} or bits != 16 or channels < 1 or rate <= 0:
                raise ValueError("only PCM16 WAV audio is supported")
            end = len(data) if size in {0, 0xFFFFFFFF} else min(len(data), body + size)
            raw = data[body:end]
            raw = raw[: len(raw) - len(raw) % (2 * channels)]
            if channels > 1:
                frames = np.frombuffer(raw, "<i2").reshape(-1, channels).astype(np.int32)
                raw = frames.mean(axis=1).astype("<i2").tobytes()
            return Pcm(raw, rate)
        offset = body + size + (size & 1)
    raise ValueError("no data chunk")


def resample(pcm: Pcm, rate: int) -> Pcm:
    """``pcm`` converted to ``rate`` Hz with a polyphase low-pass filter (scipy)."""
    if pcm.rate == rate or not pcm.samples:
        return Pcm(pcm.samples, rate)
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(pcm.rate, rate)
    x = np.frombuffer(pcm.samples, "<i2").astype(np.float32)
    y = resample_poly(x, rate // g, pcm.rate // g)
    return Pcm(np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes(), rate)


def silence(ms: float, rate: int = OUTPUT_RATE) -> bytes:
    """``ms`` milliseconds of PCM16 silence."""
    return bytes(2 * int(rate * ms / 1000))


def trim_leading(wav: bytes, ms: float) -> tuple[bytes, float]:
    """Drop the first ``ms`` milliseconds of a WAV file.

    Returns the re-encoded WAV (empty bytes when nothing is left) and the milliseconds
    still to trim from the next file. Raises ``ValueError`` for a file ``parse_wav`` rejects.
    """
    pcm = parse_wav(wav)
    drop = 2 * int(round(pcm.rate * ms / 1000))
    left = max(0.0, ms - pcm.duration_s * 1000)
    rest = pcm.samples[drop:]
    return (encode_wav(rest, pcm.rate) if rest else b""), left
