"""``livesight bench webrtc``: N WebRTC calls, each with a 640x480 30 fps camera track and a
microphone, against the same sessions over the v1 WebSocket at the sampled rate.

The server runs in its own process (``livesight serve`` on the embedded default). The peers
are aiortc's client (``server.client.webrtc_peer``) in this process: their camera sends the
bikes clip encoded once as VP8 (``PacketTrack``: packets, so the load generator does not
encode 30 frames a second per peer; the server decodes every one, as it would a browser's),
their microphone silence (Opus). Each call samples its camera at ``camera_fps`` 2.

Printed, for each transport: the server process's CPU per session (from /proc, over the
streaming window, every thread), the frame age from the moment the peer sent a frame to the
moment the server read it into the session (``livesight.camera.frame``'s
``server_receive_ts_ms`` against the send time of the frame its RTP time names; on the
WebSocket, the ack's against the send time), p50 and p99, and frames kept per session; then
the time from a spoken answer's request to its first sound on the call's audio track (the
first call asks), and the same answer's first audio delta over the WebSocket.
"""

from __future__ import annotations

import asyncio
import base64
import fractions
import io
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from PIL import Image

from server.background import ServedProcess, serve_process
from server.bench.footage import sample_clip
from server.bench.process import process_cpu_s
from server.client.connection import Connection
from server.client.webrtc_peer import VIDEO_CLOCK, Pacer, Peer, SpeechTrack
from handlers.wire.server_events import ResponseAudioDelta

FPS = 30
SAMPLED_FPS = 2
SIZE = (640, 480)
CLIP_FRAMES = 90  # 3 s of the clip, looped
ASK_TEXT = "What is in front of the camera?"


def vp8_packets(frames: int = CLIP_FRAMES, keyframes: bool = False) -> list[bytes]:
    """The bikes clip's first ``frames`` frames at 640x480, encoded once as VP8 as the packets
    a camera would send: a keyframe every 3 s (``keyframes``: every frame one, what a
    camera sends when asked for one)."""
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
    codec.time_base = fractions.Fraction(1, FPS)
    codec.bit_rate = 1_000_000
    codec.options = {"deadline": "realtime", "cpu-used": "8", "g": "1" if keyframes else str(3 * FPS),
                     "lag-in-frames": "0"}
    packets: list[bytes] = []
    with av.open(str(sample_clip())) as container:
        for n, frame in enumerate(container.decode(video=0)):
            if n >= frames:
                break
            picture = frame.to_image().convert("RGB").resize(SIZE, Image.Resampling.BILINEAR)
            out = av.VideoFrame.from_image(picture).reformat(format="yuv420p")
            out.pts, out.time_base = n, codec.time_base
            packets += [bytes(p) for p in codec.encode(out)]
    packets += [bytes(p) for p in codec.encode(None)]
    return packets


def jpeg_frames(frames: int = CLIP_FRAMES) -> list[str]:
    """The same frames as base64 JPEG (quality 80), as a WebSocket client sends them."""
    out: list[str] = []
    with av.open(str(sample_clip())) as container:
        for n, frame in enumerate(container.decode(video=0)):
            if n >= frames:
                break
            buf = io.BytesIO()
            frame.to_image().convert("RGB").resize(SIZE, Image.Resampling.BILINEAR).save(buf, "JPEG", quality=80)
            out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


class PacketTrack(MediaStreamTrack):
    """A camera sending pre-encoded VP8 packets at ``FPS``, looped, and a keyframe of the same
    picture when the receiver asks for one (an RTCP PLI reaching ``sender``), as a browser's
    encoder does; each frame's send time is kept by its number."""

    kind = "video"

    def __init__(self, packets: list[bytes], keyframes: list[bytes]) -> None:
        super().__init__()
        self.packets, self.keyframes = packets, keyframes
        self.sender: Any = None  # set by the peer that adds the track
        self.keyframes_sent = 0
        self.count = 0
        self.sent_at: dict[int, float] = {}
        self._pacer = Pacer()

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait(self.count / FPS)
        index = self.count % len(self.packets)
        data = self.packets[index]
        if self.sender is not None and getattr(self.sender, "_RTCRtpSender__force_keyframe", False):
            self.sender._RTCRtpSender__force_keyframe = False
            data = self.keyframes[index]
            self.keyframes_sent += 1
        packet = av.Packet(data)
        packet.pts = self.count * VIDEO_CLOCK // FPS
        packet.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent_at[self.count] = time.time()
        self.count += 1
        return packet


@dataclass
class Figures:
    transport: str
    sessions: int
    seconds: float
    cpu_s: float
    ages_ms: list[float] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    first_audio_ms: float = float("nan")
    peers_cpu_s: float = 0.0

    def line(self) -> str:
        ages = sorted(self.ages_ms)
        p50 = statistics.median(ages) if ages else float("nan")
        p99 = ages[min(len(ages) - 1, int(len(ages) * 0.99))] if ages else float("nan")
        per_session = self.cpu_s / self.seconds / max(1, self.sessions) * 1000
        return (f"{self.transport}: {self.sessions} sessions x {self.seconds:g} s; server CPU {per_session:.1f} ms per "
                f"session-second ({self.cpu_s:.1f} s in all); frame age p50 {p50:.0f} ms, p99 {p99:.0f} ms over "
                f"{len(ages)} frames; frames kept per session {statistics.mean(self.kept) if self.kept else 0:.1f} "
                f"({SAMPLED_FPS} a second expected); answer to first audio {self.first_audio_ms:.0f} ms; the "
                f"peers' own process {self.peers_cpu_s / self.seconds * 100:.0f}% of a core")


async def _calls(served: ServedProcess, sessions: int, seconds: float, packets: list[bytes],
                 keyframes: list[bytes]) -> Figures:
    peers: list[tuple[Peer, PacketTrack]] = []
    try:
        for _ in range(sessions):
            camera = PacketTrack(packets, keyframes)
            peer = Peer(camera=camera, microphone=SpeechTrack())
            response = await peer.call(served.http_url, session={"type": "realtime", "output_modalities": ["audio"],
                                                                 "max_output_tokens": 8,
                                                                 "livesight": {"camera_fps": SAMPLED_FPS}})
            if response.status_code != 201:
                raise RuntimeError(f"call refused: {response.status_code} {response.text}")
            peers.append((peer, camera))
        await asyncio.sleep(2.0)  # every call's media flowing
        for peer, _ in peers:
            while not peer.events.empty():
                peer.events.get_nowait()
        before, mine = process_cpu_s(served.proc.pid), process_cpu_s(os.getpid())
        start = time.monotonic()
        await asyncio.sleep(seconds)
        cpu = process_cpu_s(served.proc.pid) - before
        figures = Figures("webrtc", sessions, time.monotonic() - start, cpu)
        figures.peers_cpu_s = process_cpu_s(os.getpid()) - mine
        for peer, camera in peers:
            kept = 0
            while not peer.events.empty():
                event = peer.events.get_nowait()
                if event.get("type") != "livesight.camera.frame" or event.get("pts_ms") is None:
                    continue
                kept += 1
                sent = camera.sent_at.get(round(event["pts_ms"] * FPS / 1000))
                if sent is not None:
                    figures.ages_ms.append(event["server_receive_ts_ms"] - sent * 1000)
            figures.kept.append(kept)
        asker = peers[0][0]
        heard = len(asker.heard)
        asked = time.monotonic()
        asker.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK_TEXT}]}})
        asker.send({"type": "response.create"})
        while len(asker.heard) == heard and time.monotonic() - asked < 60:
            await asyncio.sleep(0.005)
        figures.first_audio_ms = (time.monotonic() - asked) * 1000 if len(asker.heard) > heard else float("nan")
        return figures
    finally:
        for peer, _ in peers:
            await peer.close()


async def _sockets(served: ServedProcess, sessions: int, seconds: float, frames: list[str]) -> Figures:
    conns: list[Connection] = []
    config = {"modalities": ["text", "audio"], "sampling": {"max_tokens": 8}}
    try:
        for _ in range(sessions):
            conn, _ready = await Connection.open(served.ws_url, config, open_timeout=60)
            conns.append(conn)
        figures = Figures("websocket", sessions, seconds, 0.0)

        async def stream(conn: Connection, deadline: float) -> None:
            kept, n = 0, 0
            while time.monotonic() < deadline:
                sent = time.time()
                await conn.send_frame(frames[(n * FPS // SAMPLED_FPS) % len(frames)], frame_id=n,
                                      pts_ms=n * 1000 / SAMPLED_FPS)
                ack = (await conn.wait_acks(1))[0]
                figures.ages_ms.append(ack.server_receive_ts_ms - sent * 1000)
                kept += ack.accepted
                n += 1
                await asyncio.sleep(max(0.0, 1 / SAMPLED_FPS - (time.time() - sent)))
            figures.kept.append(kept)

        before = process_cpu_s(served.proc.pid)
        start = time.monotonic()
        await asyncio.gather(*(stream(c, start + seconds) for c in conns))
        figures.cpu_s = process_cpu_s(served.proc.pid) - before
        figures.seconds = time.monotonic() - start
        asked = time.perf_counter()
        audio = [r for r in await conns[0].answer(ASK_TEXT) if isinstance(r.event, ResponseAudioDelta)]
        figures.first_audio_ms = (audio[0].at - asked) * 1000 if audio else float("nan")
        return figures
    finally:
        for conn in conns:
            await conn.close()


def run_webrtc(sessions: int, seconds: float) -> list[Figures]:
    """The calls, then the sockets, on one server; returns both transports' figures."""
    packets, keyframes, frames = vp8_packets(), vp8_packets(keyframes=True), jpeg_frames()
    with serve_process(["--log-level", "warning", "--max-sessions", str(max(64, sessions * 2)),
                        "--resume-grace-s", "0"]) as served:
        calls = asyncio.run(_calls(served, sessions, seconds, packets, keyframes))
        sockets = asyncio.run(_sockets(served, sessions, seconds, frames))
    return [calls, sockets]


def bench_webrtc(sessions: int, seconds: float) -> None:
    print(f"bench webrtc: {sessions} calls, each a {SIZE[0]}x{SIZE[1]} {FPS} fps VP8 camera (the bikes clip, encoded "
          f"once) and an Opus microphone, sampled at {SAMPLED_FPS} fps, for {seconds:g} s; then {sessions} v1 "
          f"WebSocket sessions sending the same frames as JPEG at {SAMPLED_FPS} fps; one server process "
          f"(the embedded default model)", flush=True)
    calls, sockets = run_webrtc(sessions, seconds)
    print(calls.line())
    print(sockets.line())
    print(f"server CPU per session, webrtc / websocket: x{calls.cpu_s / max(sockets.cpu_s, 1e-9):.2f} "
          f"(the calls decode {FPS} frames a second each; the sockets send {SAMPLED_FPS} JPEGs)")
