"""One stream: a camera the server pulls itself, feeding a session of its own (the same session
core as a client's, protocol v1's codec), whose watch fires and narrations go to the outbox.

``StreamTransport`` is the session's ``Transport``: its config first, then the source's
sampled frames (a frame that finds ``max_pending`` waiting is shed) and the control messages
of ``PATCH``; a ping when the camera has sent nothing for a while, so a camera that is down
does not end the session. ``StreamCodec`` reads the session's events on their way out: a
fired watch becomes a ``watch.fired`` event with its evidence (the frame that fired and the
``lookback_s`` before it, from a ring of the newest sampled frames), the answer it starts a
``watch.narration`` when it ends.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from handlers.core import events as ev
from handlers.session.transport import Decoded, Disconnected, ServeSession
from handlers.wire.client_events import VideoFrame
from handlers.wire.codec import V1Codec
from server.streams.delivery import backoff_s
from server.streams.mqtt import MqttLink
from server.streams.outbox import Outbox
from server.streams.source import SourceCounts, SourceError, SourceFrame, SourceSpec, read_source

log = logging.getLogger("livesight.streams")

#: A stream's session hears a ping after this long without a frame (its idle timeout is longer).
PING_S = 20.0
#: Seconds of sampled frames kept past the lookback: a fire decided this late still has its frame.
DECISION_MARGIN_S = 10.0
#: Errors a stream's status keeps.
KEPT_ERRORS = 10


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_pending: int = 8
    frame_side: int = 640
    open_timeout_s: float = 10.0
    read_timeout_s: float = 5.0
    retry_first_s: float = 1.0
    retry_max_s: float = 30.0
    max_lookback_s: float = 30.0


@dataclass
class StreamSettings:
    """What a stream was asked to do (``POST /v1/streams``, checked by ``routes``)."""

    source: str
    name: str | None = None
    fps: float = 2.0
    loop: bool = False
    lookback_s: float = 5.0
    config: dict[str, Any] = field(default_factory=dict)
    watches: list[dict[str, Any]] = field(default_factory=list)
    deliver: dict[str, Any] = field(default_factory=dict)

    def deliveries(self) -> list[tuple[str, dict[str, Any]]]:
        """The channels each event goes to, with their settings."""
        return [(channel, dict(target)) for channel, target in self.deliver.items() if target]


class StreamTransport:
    """The session's view of a stream (see the module)."""

    def __init__(self, config: dict[str, Any], max_pending: int) -> None:
        self._in, self._out = anyio.create_memory_object_stream[str | Decoded](max_pending)
        self._control: deque[str] = deque([json.dumps({"type": "session.config", **config})])
        self._wake = anyio.Event()
        self.shed = 0
        self.closed = False
        self.listeners: set[Callable[[str], None]] = set()  # attached clients' senders

    def frame(self, event: VideoFrame) -> bool:
        """Hand the session a sampled frame; False when it was shed (the session is behind)."""
        try:
            self._in.send_nowait(Decoded([event]))
        except anyio.WouldBlock:
            self.shed += 1
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        self._wake.set()
        return True

    def control(self, message: dict[str, Any]) -> None:
        """A control message (watch.create, watch.delete ...), read before the next frame."""
        self._control.append(json.dumps(message))
        self._wake.set()

    async def receive(self) -> str | Decoded:
        while True:
            if self._control:
                return self._control.popleft()
            if self.closed:
                raise Disconnected(1000)
            try:
                return self._out.receive_nowait()
            except anyio.WouldBlock:
                pass
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise Disconnected(1000) from None
            self._wake = anyio.Event()
            with anyio.move_on_after(PING_S) as waited:
                await self._wake.wait()
            if waited.cancelled_caught:
                return json.dumps({"type": "ping"})

    async def send(self, text: str) -> None:
        for listener in list(self.listeners):
            listener(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.end()

    def end(self) -> None:
        self.closed = True
        self._in.close()
        self._wake.set()


class StreamCodec(V1Codec):
    """Protocol v1 for a stream's session, reading its fires and narrations on their way out."""

    def __init__(self, stream: Stream, max_message_bytes: int | None = None) -> None:
        super().__init__(max_message_bytes)
        self.stream = stream

    def encode(self, event: ev.Event) -> list[str]:
        self.stream.saw(event)
        if isinstance(event, ev.SessionReady):
            self.stream.ready_text = super().encode(event)[0]  # what a client attaching later hears first
        if not self.stream.transport.listeners:
            return []  # no client attached: nothing to say it to
        return super().encode(event)


class Stream:
    """One stream from its creation to its deletion (``run`` in the streams' task group)."""

    def __init__(self, stream_id: str, settings: StreamSettings, owner: str, limits: StreamLimits,
                 outbox: Outbox, max_message_bytes: int | None = None, mqtt: MqttLink | None = None) -> None:
        self.stream_id = stream_id
        self.mqtt = mqtt
        self.settings = settings
        self.owner = owner
        self.limits = limits
        self.outbox = outbox
        self.state = "connecting"
        self.errors: deque[dict[str, Any]] = deque(maxlen=KEPT_ERRORS)
        self.counts = SourceCounts()
        self.last_frame_ms: float | None = None
        self.fires = 0
        self.narrations = 0
        self.connects = 0
        self.conditions: dict[str, str] = {}
        config = {**settings.config, "watches": settings.watches}
        self.transport = StreamTransport(config, limits.max_pending)
        self.codec = StreamCodec(self, max_message_bytes)
        # the lookback before a fired frame, and that frame still there when a busy model decides late
        side = max(1, math.ceil((min(settings.lookback_s, limits.max_lookback_s) + DECISION_MARGIN_S) * settings.fps) + 2)
        self._ring: deque[tuple[str, float, bytes]] = deque(maxlen=side)  # (frame id, wall ms, jpeg)
        self._spoken: dict[str, dict[str, Any]] = {}  # a fired watch's answer, by request id
        self._sent = 0
        self._tg: TaskGroup | None = None
        self.ready_text: str | None = None  # the session's session.ready, as v1 says it
        self.ended = anyio.Event()  # the stream's session is over (attached clients are let go)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        s = self.settings
        return {
            "stream_id": self.stream_id, "name": s.name, "source": redacted(s.source), "state": self.state,
            "fps": s.fps, "loop": s.loop, "lookback_s": s.lookback_s,
            "frames_decoded": self.counts.decoded, "frames_skipped": self.counts.skipped,
            "frames_sampled": self.counts.sampled,
            "frames_shed": self.transport.shed, "last_frame_ms": self.last_frame_ms, "connects": self.connects,
            "fires": self.fires, "narrations": self.narrations,
            "watches": [{"watch_id": w, "condition": c} for w, c in self.conditions.items()],
            "deliver": {channel: _public(target) for channel, target in s.deliver.items() if target},
            "errors": list(self.errors),
        }

    # ------------------------------------------------------------------ running
    async def run(self, serve: ServeSession) -> None:
        """Pull the source and run the session until ``stop``."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._pull)
                try:
                    await serve(self.transport, self.codec, self.owner)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self.ended.set()
        if self.state not in ("failed", "ended"):
            self.state = "stopped"

    def stop(self) -> None:
        self.transport.end()

    async def _pull(self) -> None:
        """Read the source, reconnecting with backoff and jitter while it fails."""
        failures = 0
        while True:
            stop = threading.Event()
            opened = False
            self.state = "connecting" if failures == 0 else "reconnecting"

            def on_open() -> None:
                nonlocal opened
                opened = True
                anyio.from_thread.run_sync(self._opened)

            try:
                await anyio.to_thread.run_sync(read_source, self._spec(), self._put_from_thread(stop), stop,
                                               on_open, self.counts, abandon_on_cancel=True)
                self.state = "ended"  # a file that was not looped
                return
            except SourceError as exc:
                self.errors.append({"at_ms": time.time() * 1000, "message": str(exc)})
                log.info("stream %s: %s", self.stream_id, exc)
                if exc.final:
                    self.state = "failed"
                    return
            finally:
                stop.set()
            failures = 1 if opened else failures + 1
            self.state = "reconnecting"
            await anyio.sleep(backoff_s(failures, self.limits.retry_first_s, self.limits.retry_max_s))

    def _spec(self) -> SourceSpec:
        s, limits = self.settings, self.limits
        return SourceSpec(s.source, s.fps, limits.frame_side, s.loop, limits.open_timeout_s, limits.read_timeout_s)

    def _opened(self) -> None:
        self.connects += 1
        self.state = "live"

    def _put_from_thread(self, stop: threading.Event) -> Callable[[SourceFrame], None]:
        def put(frame: SourceFrame) -> None:
            try:
                anyio.from_thread.run_sync(self._frame, frame)
            except RuntimeError:  # the loop is gone: the stream is over
                stop.set()
        return put

    def _frame(self, frame: SourceFrame) -> None:
        self._sent += 1
        frame_id = f"src_{self._sent}"
        now_ms = time.time() * 1000
        self.last_frame_ms = now_ms
        self._ring.append((frame_id, now_ms, frame.jpeg))
        data = "data:image/jpeg;base64," + base64.b64encode(frame.jpeg).decode("ascii")
        self.transport.frame(VideoFrame(type="video.frame", data=data, frame_id=frame_id, pts_ms=frame.pts_ms,
                                        capture_ts_ms=now_ms))

    # ------------------------------------------------------------------ what the session says
    def saw(self, event: ev.Event) -> None:
        """An event of the session on its way out: fires, clears and narrations go to the
        outbox; a change of the watches is announced over MQTT."""
        if isinstance(event, ev.SessionReady):
            for watch in event.config.get("watches") or []:
                self.conditions[str(watch.get("watch_id"))] = str(watch.get("condition", ""))
            self.announce_soon()
        elif isinstance(event, (ev.WatchCreated, ev.WatchUpdated)):
            watch = event.watch
            self.conditions[str(watch.get("watch_id"))] = str(watch.get("condition", ""))
            self.announce_soon()
        elif isinstance(event, ev.WatchDeleted):
            self.conditions.pop(event.watch_id, None)
        elif isinstance(event, ev.WatchFired):
            self._keep_fire(event)
        elif isinstance(event, ev.WatchCleared) and self._tg is not None:
            self._tg.start_soon(self._keep, "watch.cleared", {
                "stream_name": self.settings.name, "watch_id": event.watch_id,
                "condition": self.conditions.get(event.watch_id), "probability": event.probability,
                "frame_id": event.frame_id}, [])
        elif isinstance(event, ev.AnswerStarted) and event.trigger is not None:
            self._spoken[event.request_id] = {"watch_id": event.trigger.watch_id, "text": ""}
        elif isinstance(event, ev.AnswerTextDone) and event.request_id in self._spoken:
            self._spoken[event.request_id]["text"] = event.text
        elif isinstance(event, ev.AnswerEnded) and event.request_id in self._spoken:
            spoken = self._spoken.pop(event.request_id)
            if event.status == "completed" and self._tg is not None:
                self.narrations += 1
                watch_id = spoken["watch_id"]
                self._tg.start_soon(self._keep, "watch.narration", {
                    "stream_name": self.settings.name, "watch_id": watch_id,
                    "condition": self.conditions.get(watch_id), "text": spoken["text"]}, [])

    def announce_soon(self) -> None:
        if self._tg is not None and self.mqtt is not None and self.settings.deliver.get("mqtt"):
            self._tg.start_soon(self.announce)

    async def announce(self) -> None:
        """The stream's watches as Home Assistant binary sensors (best effort: announced again
        at each connect of the broker)."""
        target = self.settings.deliver.get("mqtt")
        if self.mqtt is None or not target:
            return
        try:
            await self.mqtt.discover(self.stream_id, self.settings.name, str(target["topic"]), dict(self.conditions))
        except Exception as exc:  # noqa: BLE001 - the broker is away: the next connect announces it
            log.info("stream %s: watches not announced over MQTT: %s", self.stream_id, exc)

    def _keep_fire(self, fired: ev.WatchFired) -> None:
        """A fire with its evidence: the frame that fired, then the lookback before it (newest first)."""
        if self._tg is None:
            return
        self.fires += 1
        ring = list(self._ring)
        at = next((n for n, (frame_id, _, _) in enumerate(ring) if frame_id == fired.frame_id), None)
        evidence: list[tuple[float, bytes]] = []
        frame_ms = None
        if at is not None:
            frame_ms = ring[at][1]
            horizon = frame_ms - self.settings.lookback_s * 1000
            evidence = [(ms, jpeg) for _, ms, jpeg in reversed(ring[: at + 1]) if ms >= horizon]
        self._tg.start_soon(self._keep, "watch.fired", {
            "stream_name": self.settings.name, "watch_id": fired.watch_id,
            "condition": self.conditions.get(fired.watch_id), "probability": fired.probability,
            "frame_id": fired.frame_id, "frame_pts_ms": fired.pts_ms, "frame_at_ms": frame_ms,
            "decision_ms": fired.decision_ms}, evidence)

    async def _keep(self, kind: str, body: dict[str, Any], evidence: list[tuple[float, bytes]]) -> None:
        event_id = "evt_" + secrets.token_hex(12)
        base = f"/v1/streams/{self.stream_id}/moments/{event_id}"
        if evidence:
            body = {**body, "evidence": {"frame": f"{base}-0.jpg",
                                         "lookback": [f"{base}-{n}.jpg" for n in range(1, len(evidence))]}}
        try:
            await self.outbox.add(event_id, self.stream_id, kind, time.time() * 1000, body, evidence,
                                  self.settings.deliveries())
        except Exception as exc:  # noqa: BLE001 - the database failed: said in the status, the stream goes on
            log.warning("stream %s: an event could not be kept: %r", self.stream_id, exc)
            self.errors.append({"at_ms": time.time() * 1000, "message": f"an event could not be kept: {exc}"})


def redacted(url: str) -> str:
    """A source URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _public(target: dict[str, Any]) -> dict[str, Any]:
    """A delivery's settings without its secret."""
    return {k: ("***" if k == "secret" and v else v) for k, v in target.items()}
