"""One WebRTC call: a peer connection whose data channel speaks a session protocol (the
``oai-events`` channel the Realtime events of ``/v1/realtime``; the ``livesight`` channel
protocol v1's, for the project's page), with the same codecs and session core as the
WebSockets; its microphone and camera tracks feed the session, and its outgoing audio track
speaks the answers.

``CallTransport`` is the session's ``Transport``: the data channel's messages and the
media pumps' inputs in one bounded queue (a peer that floods past it is ended), sends on the
channel (a peer that reads nothing past ``max_buffered_bytes`` is ended). ``CallCodec`` (the
Realtime codec) and ``V1CallCodec`` send the answers' audio to the track instead of the
channel, as OpenAI's WebRTC interface does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from handlers.core import events as ev
from handlers.realtime import RealtimeCodec
from handlers.wire.codec import V1Codec
from handlers.session.transport import Decoded, Disconnected
from server.webrtc.keyframes import KeyframeGate
from server.webrtc.media import Sampler, Speaker, camera, microphone

log = logging.getLogger("livesight.webrtc")

EVENTS_CHANNEL = "oai-events"  # the Realtime events (OpenAI's name)
V1_CHANNEL = "livesight"  # protocol v1's events
CAMERA_PREFIX = "camera_"  # the ids of the camera track's frames (media.py)
#: How long ``send`` waits for the data channel to open or drain before the peer counts as gone.
SEND_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class CallLimits:
    connect_timeout_s: float
    max_pending: int
    max_buffered_bytes: int
    max_audio_out_bytes: int
    frame_side: int


class CallTransport:
    """The session's view of a call: receive messages and media, send on the data channel."""

    def __init__(self, limits: CallLimits, label: str = EVENTS_CHANNEL) -> None:
        self.limits = limits
        self.label = label  # the data channel the session speaks on
        self._in, self._out = anyio.create_memory_object_stream[str | bytes | Decoded](limits.max_pending)
        self.channel: RTCDataChannel | None = None
        self.opened = anyio.Event()
        self.end_code: int | None = None  # 1000: hung up (the session ends for good); None: the peer vanished
        self.shed_frames = 0
        self.drained = anyio.Event()

    def attach(self, channel: RTCDataChannel) -> None:
        """Take the peer's channel named ``label`` (another is closed)."""
        if channel.label != self.label or self.channel is not None:
            channel.close()
            return
        self.channel = channel
        channel.on("message", self._message)
        channel.on("close", lambda: self.end(None))
        channel.on("bufferedamountlow", lambda: self.drained.set())
        channel.bufferedAmountLowThreshold = self.limits.max_buffered_bytes // 4
        if channel.readyState == "open":
            self.opened.set()
        channel.on("open", self.opened.set)

    def preface(self, text: str) -> None:
        """A message read before the peer's (a config the call was offered with)."""
        self._in.send_nowait(text)

    def _message(self, message: str | bytes) -> None:
        try:
            self._in.send_nowait(message)
        except anyio.WouldBlock:
            log.warning("a call's peer sent more than %d messages unread; ending it", self.limits.max_pending)
            self.end(1008)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def deliver(self, events: list[Any]) -> None:
        """Media decoded by the call's pumps; a frame that finds the queue full is shed."""
        try:
            self._in.send_nowait(Decoded(events))
        except anyio.WouldBlock:
            self.shed_frames += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def end(self, code: int | None) -> None:
        """The call is over (hung up, failed, or its channel closed): what was read is still taken."""
        if self.end_code is None:
            self.end_code = code
        self._in.close()

    async def receive(self) -> str | bytes | Decoded:
        try:
            return await self._out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise Disconnected(self.end_code) from None

    async def send(self, text: str) -> None:
        with anyio.move_on_after(SEND_WAIT_S):
            await self.opened.wait()
        channel = self.channel
        if channel is None or channel.readyState != "open":
            raise Disconnected(self.end_code)
        if channel.bufferedAmount > self.limits.max_buffered_bytes:
            self.drained = anyio.Event()
            with anyio.move_on_after(SEND_WAIT_S):
                await self.drained.wait()
            if channel.bufferedAmount > self.limits.max_buffered_bytes:
                log.warning("a call's peer reads nothing; ending it")
                self.end(1008)
                raise Disconnected(1008)
        channel.send(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.end(code)


def spoken(speaker: Speaker, event: ev.Event) -> bool:
    """Play an answer's audio on the call's track (True: the event is taken, nothing to send);
    an interrupted answer's or a cleared output's audio stops."""
    if isinstance(event, ev.AnswerAudioDelta):
        try:
            speaker.play(event.data)
        except ValueError as exc:
            log.warning("engine audio could not be played: %s", exc)
        return True
    if isinstance(event, ev.OutputAudioCleared) or (isinstance(event, ev.AnswerEnded) and event.status == "interrupted"):
        speaker.clear()
    return False


class CallCodec(RealtimeCodec):
    """The Realtime codec of a call: answers' audio goes to the outgoing track."""

    label = EVENTS_CHANNEL

    def __init__(self, speaker: Speaker, model: str | None, max_message_bytes: int | None = None,
                 bound: dict[str, Any] | None = None) -> None:
        super().__init__(model, max_message_bytes, bound)
        self.speaker = speaker

    def encode(self, event: ev.Event) -> list[str]:
        if isinstance(event, ev.FrameAcked):
            return self._frame_acked(event)
        if spoken(self.speaker, event):
            return []
        return super().encode(event)

    def _frame_acked(self, ack: ev.FrameAcked) -> list[str]:
        """A camera frame is media, as the microphone is: not a conversation item (OpenAI's
        SDK knows no image items from the server) but a ``livesight.camera.frame`` event; the
        frames it evicted leave the conversation only if they were items."""
        if not _from_camera(ack.frame_id):
            return super().encode(ack.model_copy(update={
                "dropped_frame_ids": [f for f in ack.dropped_frame_ids if not _from_camera(f)]}))
        out = [json.dumps({
            "type": "livesight.camera.frame", "event_id": self._eid(), "frame_id": ack.frame_id,
            "accepted": ack.accepted, "reason": ack.reason, "pts_ms": ack.pts_ms,
            "server_receive_ts_ms": ack.server_receive_ts_ms, "buffered_frames": ack.buffered_frames})]
        items = [f for f in ack.dropped_frame_ids if not _from_camera(f)]
        if items:
            out += super().encode(ack.model_copy(update={"frame_id": None, "dropped_frame_ids": items}))
        return out

    @property
    def camera_fps(self) -> float:
        return float(self.session.config.get("camera_fps") or 2.0)


class V1CallCodec(V1Codec):
    """Protocol v1 on a call (the project's page): answers' audio goes to the outgoing track;
    the camera's frames are acked as v1 frames are."""

    label = V1_CHANNEL

    def __init__(self, speaker: Speaker, max_message_bytes: int | None = None) -> None:
        super().__init__(max_message_bytes)
        self.speaker = speaker
        self.camera_fps = 2.0

    def encode(self, event: ev.Event) -> list[str]:
        if isinstance(event, (ev.SessionReady, ev.ConfigUpdated)):
            self.camera_fps = float(event.config.get("camera_fps") or 2.0)
        if spoken(self.speaker, event):
            return []
        return super().encode(event)


def _from_camera(frame_id: object) -> bool:
    return isinstance(frame_id, str) and frame_id.startswith(CAMERA_PREFIX)


class Call:
    """A call from its offer to its end: run ``run`` in the server's task group."""

    def __init__(self, call_id: str, pc: RTCPeerConnection, transport: CallTransport,
                 codec: CallCodec | V1CallCodec, limits: CallLimits) -> None:
        self.call_id = call_id
        self.pc = pc
        self.transport = transport
        self.codec = codec
        self.limits = limits
        self.tracks: list[MediaStreamTrack] = []
        self.sampler = Sampler(2.0)
        self.gate: KeyframeGate | None = None
        self.connected = False
        pc.on("datachannel", transport.attach)
        pc.on("track", self.tracks.append)
        pc.on("connectionstatechange", self._state)

    def _state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.transport.end(None)

    def hang_up(self) -> None:
        self.transport.end(1000)

    async def run(self, serve: Callable[[], Awaitable[None]]) -> None:
        """Wait for the data channel (``connect_timeout_s``), then serve the session; the
        peer connection is closed at the end whatever happened."""
        try:
            with anyio.move_on_after(self.limits.connect_timeout_s):
                await self.transport.opened.wait()
            if not self.transport.opened.is_set():
                log.info("call %s: no data channel within %g s; ended", self.call_id[-8:], self.limits.connect_timeout_s)
                return
            if self.transport.end_code is not None:
                return
            self.connected = True
            async with anyio.create_task_group() as tg:
                for track in self.tracks:
                    if track.kind == "audio":
                        tg.start_soon(microphone, track, self.transport.deliver)
                    elif track.kind == "video":
                        tg.start_soon(self._camera, track)
                await serve()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                self.transport.end(None)
                await self.pc.close()

    def _gate(self, track: MediaStreamTrack) -> KeyframeGate | None:
        """Put a ``KeyframeGate`` before the decoder of ``track``'s receiver (None: not found)."""
        receiver = next((t.receiver for t in self.pc.getTransceivers() if t.receiver.track is track), None)
        if receiver is None or not hasattr(receiver, "_RTCRtpReceiver__decoder_queue"):
            return None

        async def request() -> None:
            for source in receiver.getSynchronizationSources():  # the media's, and its retransmissions'
                await receiver._send_rtcp_pli(source.source)

        gate = KeyframeGate(receiver._RTCRtpReceiver__decoder_queue, self.sampler, request)
        receiver._RTCRtpReceiver__decoder_queue = gate
        return gate

    async def _camera(self, track: MediaStreamTrack) -> None:
        self.gate = self._gate(track)

        async def deliver(events: list[Any]) -> None:
            self.sampler.fps = self.codec.camera_fps  # the session may change it
            await self.transport.deliver(events)

        await camera(track, self.sampler, self.limits.frame_side, deliver)
