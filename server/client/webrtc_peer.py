"""A WebRTC peer of livesight's ``/v1/realtime/calls`` (aiortc's own client side), for the
tests and ``livesight bench webrtc``: it offers a camera and a microphone track and the
``oai-events`` data channel, reads the Realtime events, and keeps the audio it hears."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame

VIDEO_CLOCK = 90_000
AUDIO_RATE = 48_000
AUDIO_FRAME = 960


class Pacer:
    """Real time for a track that makes its own media: ``await wait(t)`` returns when ``t``
    seconds have passed since the first call (at once when that time is past)."""

    def __init__(self) -> None:
        self._start: float | None = None

    async def wait(self, at_s: float) -> None:
        now = time.monotonic()
        self._start = now if self._start is None else self._start
        if self._start + at_s > now:
            await asyncio.sleep(self._start + at_s - now)


class PictureTrack(MediaStreamTrack):
    """A camera: ``picture(n)`` (H x W x 3 RGB) for its ``n``-th frame, at ``fps``; each
    frame's send time is kept by its number (``sent_at``)."""

    kind = "video"

    def __init__(self, picture: Callable[[int], np.ndarray], fps: float) -> None:
        super().__init__()
        self.picture, self.fps = picture, fps
        self.count = 0
        self.sent_at: dict[int, float] = {}
        self._pacer = Pacer()

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait(self.count / self.fps)
        frame = VideoFrame.from_ndarray(self.picture(self.count), format="rgb24")
        frame.pts = int(self.count * VIDEO_CLOCK / self.fps)
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent_at[self.count] = time.time()
        self.count += 1
        return frame


class SpeechTrack(MediaStreamTrack):
    """A microphone: PCM16 mono at 48 kHz queued with ``say``, silence between."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pcm = bytearray()
        self._sent = 0
        self._pacer = Pacer()

    def say(self, pcm16_48k: bytes) -> None:
        self._pcm += pcm16_48k

    @property
    def speaking(self) -> bool:
        return bool(self._pcm)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait(self._sent / AUDIO_RATE)
        chunk = bytes(self._pcm[: AUDIO_FRAME * 2]).ljust(AUDIO_FRAME * 2, b"\0")
        del self._pcm[: AUDIO_FRAME * 2]
        frame = AudioFrame(format="s16", layout="mono", samples=AUDIO_FRAME)
        frame.planes[0].update(chunk)
        frame.pts, frame.sample_rate = self._sent, AUDIO_RATE
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        self._sent += AUDIO_FRAME
        return frame


class Peer:
    """One call: ``await call(base_url, key)``, then ``send`` and ``next`` events."""

    def __init__(self, camera: MediaStreamTrack | None = None, microphone: MediaStreamTrack | None = None,
                 path: str = "/v1/realtime/calls", channel: str = "oai-events") -> None:
        self.pc = RTCPeerConnection()
        self.camera, self.microphone = camera, microphone
        self.path = path  # where offers go (/v1/video/chat/calls with the livesight channel: protocol v1)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.channel = self.pc.createDataChannel(channel)
        self.channel.on("message", lambda m: self.events.put_nowait(json.loads(m)))
        self.opened = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.heard = bytearray()  # the answers' audio (48 kHz mono PCM16), silence left out
        self.heard_frames = 0
        self.call_id: str | None = None
        self.location: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", self._track)

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.ensure_future(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.heard_frames += 1
            samples = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0]
            if np.abs(samples).max(initial=0) > 64:
                self.heard += samples.astype(np.int16).tobytes()

    async def call(self, base_url: str, key: str | None = None, *, session: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> httpx.Response:
        """Offer, post, answer; returns the server's response (201 when the call is on)."""
        if self.microphone is not None:
            self.pc.addTrack(self.microphone)
        else:
            self.pc.addTransceiver("audio", direction="recvonly")
        if self.camera is not None:
            sender = self.pc.addTrack(self.camera)
            if hasattr(self.camera, "sender"):
                self.camera.sender = sender  # a track of encoded packets answers keyframe requests itself
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sent = dict(headers or {})
        if key:
            sent["Authorization"] = f"Bearer {key}"
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as http:
            if session is None:
                response = await http.post(self.path, content=self.pc.localDescription.sdp,
                                           headers={**sent, "Content-Type": "application/sdp"})
            else:
                response = await http.post(self.path, headers=sent, files={
                    "sdp": (None, self.pc.localDescription.sdp), "session": (None, json.dumps(session))})
        if response.status_code != 201:
            return response
        self.location = response.headers["location"]
        self.call_id = self.location.rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        await asyncio.wait_for(self.opened.wait(), timeout_s)
        return response

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def next(self, *types: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The next event of one of ``types`` (an ``error`` too), skipping others."""
        async with asyncio.timeout(timeout_s):
            while True:
                event = await self.events.get()
                if event["type"] in types or event["type"] == "error":
                    return event

    async def hang_up(self, base_url: str, key: str | None = None) -> httpx.Response:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            return await http.post(f"{self.path}/{self.call_id}/hangup",
                                   headers={"Authorization": f"Bearer {key}"} if key else {})

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()
