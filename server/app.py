"""The FastAPI application: the WebSocket route, health, metrics and the browser client."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect, WebSocketState

from handlers import blocking
from handlers.core import Limits
from handlers.errors import CLOSE_CODES, ErrorCode
from handlers.frames import live_frame_count
from handlers.codec import V1Codec, WireCodec
from handlers.protocol import ErrorEvent
from handlers.realtime import RealtimeCodec
from handlers.session import Session
from handlers.transport import Disconnected
from server.auth import AccessPolicy, warn_if_open
from server.engines import create_engine
from server.engines.base import Engine
from server.settings import Settings
from server.speech import create_voice

log = logging.getLogger("livesight.server")
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
WS_PATH = "/v1/video/chat/stream"
REALTIME_PATH = "/v1/realtime"  # OpenAI Realtime (GA shape) over the same session core


class WebSocketTransport:
    """Starlette's WebSocket as a session ``Transport``."""

    def __init__(self, ws: WebSocket, max_message_bytes: int) -> None:
        self.ws = ws
        self.max_message_bytes = max_message_bytes

    async def receive(self) -> str | bytes:
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise Disconnected
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

    async def close(self, code: int = 1000) -> None:
        if self.ws.application_state is WebSocketState.CONNECTED:
            try:
                await self.ws.close(code)
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass  # the client closed first


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    """Build the app. Without ``engine``, the one named by ``settings`` is created at start-up."""
    sessions: set[Session] = set()
    access = AccessPolicy([k.get_secret_value() for k in settings.api_keys], settings.allowed_origins)
    warn_if_open(settings.host, access)
    blocking.configure(settings.decode_threads)
    limits = Limits(
        max_frame_bytes=settings.max_frame_bytes,
        max_audio_bytes=settings.max_audio_bytes,
        max_queue=settings.max_queue,
        idle_timeout_s=settings.idle_timeout_s,
        max_history_turns=settings.max_history_turns,
        max_answer_tokens=settings.max_answer_tokens,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.voice = create_voice(settings)  # checks the voice settings before anything loads
        app.state.engine = engine or create_engine(settings)
        await app.state.engine.start()
        try:
            await app.state.voice.start()
            log.info("livesight ready on ws://%s:%s%s", settings.host, settings.port, WS_PATH)
            yield
        finally:
            await app.state.voice.close()
            await app.state.engine.close()

    app = FastAPI(title="livesight", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "engine": asdict(app.state.engine.capabilities), "sessions": len(sessions)}

    @app.get("/metrics")
    async def metrics(request: Request) -> JSONResponse:
        if not access.http_key(request.headers, request.query_params):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        gc.collect()
        return JSONResponse(
            {
                "sessions": len(sessions),
                "sessions_busy": sum(not s.settled for s in sessions),
                "frames_live": live_frame_count(),
                "tasks": len(asyncio.all_tasks()),
                "engine": getattr(app.state.engine, "stats", lambda: {})(),
            }
        )

    @app.websocket(WS_PATH)
    async def stream(ws: WebSocket) -> None:
        await serve(ws, V1Codec())

    @app.websocket(REALTIME_PATH)
    async def realtime(ws: WebSocket) -> None:
        await serve(ws, RealtimeCodec(ws.query_params.get("model")))

    async def serve(ws: WebSocket, codec: WireCodec) -> None:
        """One session over ``ws``, speaking the wire protocol of ``codec``."""
        verdict = access.check(ws.headers, ws.query_params, ws.scope.get("subprotocols", []))
        await ws.accept(subprotocol=verdict.subprotocol)
        transport = WebSocketTransport(ws, settings.max_message_bytes)
        if verdict.refusal is not None:
            log.info("refused a connection: %s", verdict.refusal.value)
            await _refuse(transport, verdict.refusal, verdict.message, codec)
            return
        if len(sessions) >= settings.max_sessions:
            message = f"the server is at its limit of {settings.max_sessions} sessions"
            await _refuse(transport, ErrorCode.TOO_MANY_SESSIONS, message, codec)
            return
        session = Session(transport, app.state.engine, limits, settings.config_timeout_s, app.state.voice, codec)
        sessions.add(session)
        try:
            await session.run()
        finally:
            sessions.discard(session)

    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static")
    return app


async def _refuse(transport: WebSocketTransport, code: ErrorCode, message: str, codec: WireCodec) -> None:
    try:
        for text in codec.encode(ErrorEvent(code=code.value, message=message, closes_session=True)):
            await transport.send(text)
    except Disconnected:
        return
    await transport.close(CLOSE_CODES[code])
