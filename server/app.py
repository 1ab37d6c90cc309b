"""The FastAPI application: the WebSocket route, health, metrics and the browser client."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

import anyio
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect, WebSocketState

from handlers.core.events import ErrorReported
from handlers.media import pixel_pool
from server import blocking
from handlers.core.negotiation import Limits
from handlers.wire.errors import CLOSE_CODES, ErrorCode
from handlers.core.frames import live_frame_count
from handlers.core.rate_limit import ControlLimits
from handlers.session.intake import Admission, IntakeLimits, ReadAhead
from handlers.session.observer import Observers
from handlers.session.resume import ParkedSession, ParkingLot
from handlers.wire.codec import CloseConnection, V1Codec, WireCodec
from handlers.realtime import RealtimeCodec
from handlers.live import LiveCodec
from handlers.session.adapter import Session
from handlers.session.transport import Disconnected, Prefaced, Transport
from server.auth import AccessPolicy, warn_if_open
from server.client_secrets import ClientSecrets
from server.streams.attach import attach
from server.streams.delivery import DeliveryLimits, Sender
from server.streams.mqtt import MqttLink
from server.streams.outbox_factory import open_outbox
from server.streams.registry import Streams, add_stream_routes, load_streams_file
from server.streams.stream import StreamLimits
from server.webrtc.calls import Calls, add_call_routes
from server.drain import drain_sessions
from server.engines.factory import create_engine
from server.engines.base import Engine
from server.process_memory import MemoryReturn, set_huge_pages
from server.memory.service import (
    keyframe_response, memory_policy, memory_summary, moments_listing, open_memory, sweep_memory,
)
from server.logs import SessionLog
from server.metrics import CONTENT_TYPE, Metrics
from server.settings import Settings
from server.speech.factory import create_voice

log = logging.getLogger("livesight.server")
#: How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.0005
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
WS_PATH = "/v1/video/chat/stream"
REALTIME_PATH = "/v1/realtime"  # OpenAI Realtime (GA shape) over the same session core
#: Gemini Live, at the paths the google-genai SDK opens (API versions v1, v1beta, v1alpha;
#: ``Constrained`` is its ephemeral-token method).
LIVE_PATHS = tuple(
    f"/ws/google.ai.generativelanguage.{version}.GenerativeService.{method}"
    for version in ("v1", "v1beta", "v1alpha")
    for method in ("BidiGenerateContent", "BidiGenerateContentConstrained")
)


class WebSocketTransport:
    """Starlette's WebSocket as a session ``Transport``."""

    def __init__(self, ws: WebSocket, max_message_bytes: int) -> None:
        self.ws = ws
        self.max_message_bytes = max_message_bytes

    async def receive(self) -> str | bytes:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise Disconnected(message.get("code"))
        if message.get("text") is not None:
            return message["text"]
        return message.get("bytes") or b""

    async def send(self, text: str) -> None:
        if self.ws.application_state is not WebSocketState.CONNECTED:
            raise Disconnected
        try:
            await self.ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise Disconnected from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.ws.application_state is WebSocketState.CONNECTED:
            try:
                await self.ws.close(code, reason or None)
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass  # the client closed first


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    """Build the app. Without ``engine``, the one named by ``settings`` is created at start-up."""
    sessions: set[Session] = set()
    access = AccessPolicy([k.get_secret_value() for k in settings.api_keys], settings.allowed_origins,
                          ClientSecrets(settings.max_client_secrets))
    warn_if_open(settings.host, access)
    blocking.configure(settings.decode_threads)
    set_huge_pages(settings.transparent_huge_pages)
    pixel_pool.configure(settings.pixel_pool_bytes)
    limits = Limits(
        max_frame_bytes=settings.max_frame_bytes,
        max_audio_bytes=settings.max_audio_bytes,
        max_queue=settings.max_queue,
        idle_timeout_s=settings.idle_timeout_s,
        max_history_turns=settings.max_history_turns,
        max_history_tokens=settings.max_history_tokens,
        max_answer_tokens=settings.max_answer_tokens,
        max_watches=settings.max_watches,
        min_check_interval_ms=settings.min_check_interval_ms,
    )
    intake = IntakeLimits(
        max_read_ahead_bytes=settings.max_read_ahead_bytes,
        intake_max_wait_ms=settings.intake_max_wait_ms,
        max_image_pixels=settings.max_image_pixels,
        max_image_aspect_ratio=settings.max_image_aspect_ratio,
        heavy_image_pixels=settings.heavy_image_pixels,
    )
    control = ControlLimits(
        rate_per_s=settings.control_rate_per_s,
        burst=settings.control_burst,
        answer_rate_per_s=settings.answer_rate_per_s,
        answer_burst=settings.answer_burst,
        close_after_s=settings.rate_limit_close_s,
    )
    read_ahead = ReadAhead(settings.max_server_read_ahead_bytes)
    admission = Admission(settings.max_sessions, settings.max_pending_connections)
    memory = MemoryReturn()

    async def release_parked(parked: ParkedSession) -> None:
        parked.core.close()
        await app.state.engine.release(parked.session_id)

    parking = ParkingLot(settings.resume_grace_s, settings.max_parked_sessions, release_parked)

    async def sweep_parked() -> None:
        while True:
            await anyio.sleep(min(1.0, settings.resume_grace_s / 4))
            await parking.sweep()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await outbox.open()
        try:
            async with open_memory(settings) as remembered:
                app.state.memory = remembered
                app.state.memory_policy = memory_policy(settings) if remembered is not None else None
                async with _serving(app):
                    yield
        finally:
            await outbox.close()

    @asynccontextmanager
    async def _serving(app: FastAPI) -> AsyncIterator[None]:
        app.state.voice = create_voice(settings)  # checks the voice settings before anything loads
        app.state.engine = engine or create_engine(settings)
        await app.state.engine.start()
        try:
            await app.state.voice.start()
            # Everything loaded so far (the model, torch, tokenizers) lives as long as the
            # process: keep it out of the cycle collector, whose full passes over it cost
            # ~250 ms each (measured with the tiny model) and ran during frame intake.
            gc.collect()
            gc.freeze()
            # Each socket write on the event loop releases the GIL; taking it back waits for
            # a decode or model thread to yield, by default up to 5 ms: that wait was most of
            # the ack latency under load. 0.5 ms keeps the loop responsive.
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
            scheme = "wss" if settings.ssl_certfile else "ws"
            log.info("livesight ready on %s://%s:%s%s", scheme, settings.host, settings.port, WS_PATH)
            async with anyio.create_task_group() as tg:
                if settings.resume_grace_s > 0:
                    tg.start_soon(sweep_parked)
                tg.start_soon(metrics.watch_event_loop)
                calls.tg = streams.tg = tg
                tg.start_soon(sender.run)
                if mqtt is not None:
                    tg.start_soon(mqtt.run)
                await streams.give(given_streams)
                tg.start_soon(streams.hold)
                if app.state.memory is not None:
                    tg.start_soon(app.state.memory.writer.run)
                    tg.start_soon(sweep_memory, app.state.memory, settings.memory_max_age_s)
                yield
                for call in list(calls.calls.values()):
                    call.hang_up()
                await streams.close()
                tg.cancel_scope.cancel()
        finally:
            await parking.clear()
            await app.state.voice.close()
            await app.state.engine.close()

    app = FastAPI(title="livesight", lifespan=lifespan)
    app.state.metrics = metrics = Metrics(lambda: app.state.engine.kv_cache_tokens(), parked=lambda: len(parking))
    app.state.draining = False

    async def drain() -> None:
        """Refuse new sessions; close the open ones gracefully (server/drain.py)."""
        app.state.draining = True
        await drain_sessions(sessions, settings.drain_timeout_s)

    app.state.drain = drain

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "engine": asdict(app.state.engine.capabilities), "sessions": len(sessions)}

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        if not access.http_key(request.headers, request.query_params):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/metrics.json")
    async def summary(request: Request) -> JSONResponse:
        if not access.http_key(request.headers, request.query_params):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        if not sessions:
            gc.collect()  # count only frames still held; never while sessions stream (it stalls them)
        return JSONResponse(
            {
                "sessions": len(sessions),
                "sessions_busy": sum(not s.settled for s in sessions),
                "sessions_active": len(admission.active),
                "connections_pending": admission.pending,
                "read_ahead_bytes": read_ahead.used,
                "sessions_parked": len(parking),
                "frames_live": live_frame_count(),
                "tasks": len(asyncio.all_tasks()),
                "pixel_pool": {
                    "reused": pixel_pool.POOL.reused, "fresh": pixel_pool.POOL.fresh,
                    "held_bytes": pixel_pool.POOL.held_bytes,
                },
                "event_loop_lag_max_ms": round(metrics.take_loop_lag_max() * 1000, 1),
                "watches": dict(metrics.watch_totals),
                "memory": memory_summary(app.state.memory, metrics.memory_totals),
                "webrtc": {"calls": len(app.state.calls.calls), "connecting": app.state.calls.connecting,
                           "started": app.state.calls.started, "abandoned": app.state.calls.abandoned,
                           "client_secrets": len(access.client_secrets),
                           "camera_frames": app.state.calls.camera_frames()},
                "streams": {"streams": len(streams.streams),
                            "states": dict(Counter(s.state for s in streams.streams.values())),
                            "delivered": sender.delivered, "failed_tries": sender.failed_tries,
                            "given_up": sender.given_up,
                            "mqtt": None if mqtt is None else {"connected": mqtt.connected.is_set(),
                                                               "connects": mqtt.connects, "published": mqtt.published}},
                "engine": app.state.engine.stats(),
                "kv_cache_tokens": app.state.engine.kv_cache_tokens(),
            }
        )

    @app.get("/v1/sessions/{session_id}/moments")
    async def list_moments(session_id: str, request: Request) -> Response:
        if not access.http_key(request.headers, request.query_params):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await moments_listing(app.state.memory, session_id, request.query_params,
                                     access.owner(request.headers, request.query_params))

    @app.get("/v1/sessions/{session_id}/moments/{moment_id}.jpg")
    async def moment_jpeg(session_id: str, moment_id: int, request: Request) -> Response:
        if not access.http_key(request.headers, request.query_params):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await keyframe_response(app.state.memory, session_id, moment_id,
                                       access.owner(request.headers, request.query_params))

    @app.websocket(WS_PATH)
    async def stream(ws: WebSocket) -> None:
        if "stream_id" in ws.query_params:
            await attach_client(ws)
            return
        await serve(ws, V1Codec(settings.max_message_bytes), "video_chat")

    async def attach_client(ws: WebSocket) -> None:
        """A v1 client attached to a stream's session (server/streams/attach.py)."""
        codec = V1Codec(settings.max_message_bytes)
        subprotocols = ws.scope.get("subprotocols", [])
        verdict = access.check(ws.headers, ws.query_params, subprotocols)
        await ws.accept(subprotocol=verdict.subprotocol)
        transport = WebSocketTransport(ws, settings.max_message_bytes)
        if verdict.refusal is not None:
            metrics.refused(verdict.refusal)
            await _refuse(transport, verdict.refusal, verdict.message, codec)
            return
        found = streams.get(ws.query_params["stream_id"], access.owner(ws.headers, ws.query_params, subprotocols))
        if found is None:
            await _refuse(transport, ErrorCode.STREAM_NOT_FOUND, "no such stream (or not one of this key's)", codec)
            return
        await attach(found, transport, settings.stream_max_attached_events)

    @app.websocket(REALTIME_PATH)
    async def realtime(ws: WebSocket) -> None:
        await serve(ws, RealtimeCodec(ws.query_params.get("model"), settings.max_message_bytes), "realtime")

    async def gemini_live(ws: WebSocket) -> None:
        await serve(ws, LiveCodec(settings.max_message_bytes), "gemini_live")

    for path in LIVE_PATHS:
        app.add_api_websocket_route(path, gemini_live)

    async def serve(ws: WebSocket, codec: WireCodec, protocol: str) -> None:
        """One session over ``ws``, speaking the wire protocol of ``codec``."""
        async with admission.setting_up():
            verdict = access.check(ws.headers, ws.query_params, ws.scope.get("subprotocols", []))
            await ws.accept(subprotocol=verdict.subprotocol)
        transport = WebSocketTransport(ws, settings.max_message_bytes)
        if verdict.refusal is not None:
            log.info("refused a connection: %s", verdict.refusal.value)
            metrics.refused(verdict.refusal)
            await _refuse(transport, verdict.refusal, verdict.message, codec)
            return
        if app.state.draining:
            metrics.refused(ErrorCode.SERVER_CLOSING)
            await _refuse(transport, ErrorCode.SERVER_CLOSING, "the server is shutting down; connect again", codec)
            return
        subprotocols = ws.scope.get("subprotocols", [])
        secret = access.secret(ws.headers, ws.query_params, subprotocols)
        if secret is not None and secret.session and isinstance(codec, RealtimeCodec):
            codec = RealtimeCodec(ws.query_params.get("model"), settings.max_message_bytes, secret.session)
            transport = Prefaced(transport, json.dumps({"type": "session.update", "session": secret.session}))
        await run_session(new_session(transport, codec, protocol, access.owner(ws.headers, ws.query_params, subprotocols)))

    def new_session(transport: Transport, codec: WireCodec, protocol: str, owner: str) -> Session:
        """A session over ``transport``; not counted against max_sessions until it is configured (Admission)."""
        return Session(
            transport, app.state.engine, limits, settings.config_timeout_s, app.state.voice, codec,
            intake=intake, read_ahead=read_ahead, admission=admission, control=control,
            observer=Observers(metrics.session_observer(protocol), SessionLog(protocol)),
            parking=parking if settings.resume_grace_s > 0 else None, owner=owner,
            memory=app.state.memory, memory_policy=app.state.memory_policy,
        )

    async def run_session(session: Session) -> None:
        sessions.add(session)
        try:
            await session.run()
        finally:
            sessions.discard(session)
            await memory.session_closed(remaining=len(sessions))

    async def serve_call(transport: Transport, codec: WireCodec, owner: str) -> None:
        await run_session(new_session(transport, codec, "webrtc", owner))

    calls = Calls(settings, access, admission, serve_call)
    app.state.calls = calls
    add_call_routes(app, calls, access, lambda: app.state.draining)

    async def serve_stream(transport: Transport, codec: WireCodec, owner: str) -> None:
        await run_session(new_session(transport, codec, "stream", owner))

    given_streams = load_streams_file(settings.streams) if settings.streams is not None else []
    outbox = open_outbox(settings.memory_url, settings.data_dir, settings.stream_max_events)
    mqtt = MqttLink(settings.mqtt_url, settings.mqtt_discovery_prefix) if settings.mqtt_url else None
    sender = Sender(outbox, DeliveryLimits(settings.webhook_timeout_s, settings.webhook_max_age_s, 1.0,
                                           settings.webhook_max_retry_s, settings.webhook_concurrency),
                    mqtt.deliver if mqtt is not None else None)
    stream_limits = StreamLimits(settings.stream_max_pending_frames, settings.stream_frame_side,
                                 settings.stream_open_timeout_s, settings.stream_read_timeout_s, 1.0,
                                 settings.stream_retry_max_s, settings.stream_max_lookback_s)
    streams = Streams(outbox, stream_limits, settings.max_streams, serve_stream, settings.max_message_bytes, mqtt,
                      settings.stream_lease_s)
    app.state.streams, app.state.sender = streams, sender
    add_stream_routes(app, streams, access, lambda: app.state.draining)

    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static")
    return app


async def _refuse(transport: WebSocketTransport, code: ErrorCode, message: str, codec: WireCodec) -> None:
    try:
        for text in codec.encode(ErrorReported(code=code.value, message=message, closes_session=True)):
            await transport.send(text)
    except CloseConnection as close:  # a protocol that says it with the close itself
        await transport.close(close.code, close.reason)
        return
    except Disconnected:
        return
    await transport.close(CLOSE_CODES[code])
