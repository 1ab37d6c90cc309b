"""A call's media, as the session core takes it and gives it back.

- ``microphone``: the peer's audio track (Opus, decoded by aiortc to 48 kHz) as the core's
  microphone audio, in chunks of ``CHUNK_MS``.
- ``camera``: the peer's video track sampled to the session's frame rate by the frames'
  RTP times; only a sampled frame is scaled (to at most ``max_side``) and encoded as JPEG,
  off the event loop.
- ``Speaker``: the session's spoken answers as an outgoing audio track, paced at 20 ms a
  frame, nothing sent between answers, at most ``max_bytes`` of audio waiting.

Each pump hands the core its inputs through ``deliver`` and ends when the track does.
"""

from __future__ import annotations

import asyncio
import base64
import fractions
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import simplejpeg
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame as AvVideoFrame

from handlers.wire.audio import microphone_audio, speaker_audio
from handlers.wire.client_events import AudioChunkIn, VideoFrame
from server import blocking

log = logging.getLogger("livesight.webrtc")

#: Microphone audio handed to the core at a time.
CHUNK_MS = 100
#: The outgoing track's rate and frame (Opus at 48 kHz, 20 ms frames).
SPEAKER_RATE = 48_000
SPEAKER_FRAME = 960
FRAME_QUALITY = 85

Deliver = Callable[[list[Any]], Awaitable[None]]


async def microphone(track: MediaStreamTrack, deliver: Deliver) -> None:
    """The peer's microphone, in ``CHUNK_MS`` chunks, until the track ends."""
    pending = bytearray()
    rate = 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        samples = frame.to_ndarray()  # s16, (1, n * channels) interleaved
        channels = len(frame.layout.channels)
        mono = samples.reshape(-1, channels).mean(axis=1).astype(np.int16) if channels > 1 else samples.reshape(-1)
        rate = frame.sample_rate
        pending += mono.tobytes()
        if len(pending) >= rate * 2 * CHUNK_MS // 1000:
            chunk, pending = bytes(pending), bytearray()
            await deliver([AudioChunkIn(type="audio.chunk", data=microphone_audio(chunk, rate))])


class Sampler:
    """Which frames of a track to keep: one per ``1 / fps`` of the frames' own (RTP) time.
    ``gated``: the frames were chosen before they were decoded (``keyframes.KeyframeGate``),
    so the pump keeps every one it gets."""

    def __init__(self, fps: float) -> None:
        self.fps = fps
        self._next: float | None = None
        self.seen = 0
        self.kept = 0
        self.gated = False

    def due(self, at_s: float) -> bool:
        return self._next is None or at_s >= self._next

    @property
    def next_due(self) -> float | None:
        """The source time from which the next frame is kept (None: the next one is)."""
        return self._next

    def take(self, at_s: float) -> bool:
        """The pump's choice for a decoded frame."""
        if self.gated:
            self.seen += 1
            return True
        return self.keep(at_s)

    def keep(self, at_s: float) -> bool:
        self.seen += 1
        if not self.due(at_s):
            return False
        step = 1.0 / self.fps
        # after a gap, sample from now (never a burst to catch up)
        self._next = at_s + step if self._next is None or at_s - self._next > step else self._next + step
        self.kept += 1
        return True


def frame_jpeg(frame: AvVideoFrame, max_side: int) -> bytes:
    """A decoded frame at most ``max_side`` pixels a side, as JPEG (a thread's work)."""
    scale = min(1.0, max_side / max(frame.width, frame.height))
    width, height = max(2, int(frame.width * scale) // 2 * 2), max(2, int(frame.height * scale) // 2 * 2)
    pixels = frame.to_ndarray(format="rgb24", width=width, height=height)
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=FRAME_QUALITY, colorspace="RGB")


async def camera(track: MediaStreamTrack, sampler: Sampler, max_side: int, deliver: Deliver) -> None:
    """The peer's camera, sampled, until the track ends. A frame's ``pts_ms`` is its RTP time."""
    first: float | None = None
    delivered = 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        at_s = float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base else time.monotonic()
        first = at_s if first is None else first
        if not sampler.take(at_s):
            continue
        jpeg = await blocking.run_blocking(frame_jpeg, frame, max_side)
        delivered += 1
        data = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
        await deliver([VideoFrame(type="video.frame", data=data, frame_id=f"camera_{delivered}",
                                  pts_ms=round((at_s - first) * 1000, 3), capture_ts_ms=time.time() * 1000)])


class Speaker(MediaStreamTrack):
    """The session's spoken answers as an audio track (silence between them)."""

    kind = "audio"

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self._pcm = bytearray()
        self._start: float | None = None
        self._sent = 0
        self.dropped_bytes = 0
        self.playing = False
        self._waiting = asyncio.Event()  # set when audio is queued

    def play(self, wav_base64: str) -> None:
        """Queue an answer's audio delta (a WAV file, base64); past ``max_bytes`` it is dropped."""
        pcm = speaker_audio(wav_base64, SPEAKER_RATE)
        room = self.max_bytes - len(self._pcm)
        if len(pcm) > room:
            self.dropped_bytes += len(pcm) - max(0, room)
            pcm = pcm[: max(0, room) // 2 * 2]
        self._pcm += pcm
        if self._pcm:
            self._waiting.set()

    def clear(self) -> None:
        """Stop what is playing (an answer was interrupted)."""
        self._pcm.clear()

    @property
    def queued_ms(self) -> float:
        return len(self._pcm) / 2 / SPEAKER_RATE * 1000

    async def recv(self) -> AudioFrame:
        """The next 20 ms of the answers' audio, paced; while there is none it waits (nothing
        is sent between answers: no Opus encoding, no packets), and the frame after a pause
        carries the time that passed (RTP timestamps follow the wall clock)."""
        if self.readyState != "live":
            raise MediaStreamError
        if not self._pcm:
            self._waiting = asyncio.Event()
            await self._waiting.wait()
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._sent / SPEAKER_RATE
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > 0.2:  # after a pause (or a stall): resume from now rather than burst
            self._sent = int((now - self._start) * SPEAKER_RATE) // SPEAKER_FRAME * SPEAKER_FRAME
        size = SPEAKER_FRAME * 2
        chunk = bytes(self._pcm[:size])
        del self._pcm[:size]
        self.playing = bool(chunk)
        frame = AudioFrame(format="s16", layout="mono", samples=SPEAKER_FRAME)
        frame.planes[0].update(chunk.ljust(size, b"\0"))
        frame.pts = self._sent
        frame.sample_rate = SPEAKER_RATE
        frame.time_base = fractions.Fraction(1, SPEAKER_RATE)
        self._sent += SPEAKER_FRAME
        return frame
