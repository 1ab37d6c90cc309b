"""OpenAI's WebRTC interface: ``POST /v1/realtime/calls`` (an SDP offer in, ``201`` with the
answer and ``Location: /v1/realtime/calls/{call_id}``), ``POST .../{call_id}/hangup``, and
``POST /v1/realtime/client_secrets`` (ephemeral ``ek_`` keys), with the CORS a page served
from an allowed origin needs to call them as it would call OpenAI; and the same calls
speaking protocol v1 at ``/v1/video/chat/calls`` (the project's page).

A call's offer is refused with a clear 400 when it is not a WebRTC offer; while
``max_pending_connections`` calls are still connecting, or the server holds ``max_sessions``
sessions, more are refused with 503 (the WebSocket endpoints' admission)."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from anyio.abc import TaskGroup
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from handlers.realtime import client_events as rtc
from handlers.session.intake import Admission
from handlers.session.transport import ServeSession
from server.auth import AccessPolicy, same_origin
from server.client_secrets import ClientSecretError
from server.settings import Settings
from server.webrtc.call import Call, CallCodec, CallLimits, CallTransport, V1CallCodec
from server.webrtc.media import SPEAKER_RATE, Speaker

log = logging.getLogger("livesight.webrtc")

CALLS_PATH = "/v1/realtime/calls"  # the Realtime events on the oai-events channel
V1_CALLS_PATH = "/v1/video/chat/calls"  # protocol v1 on the livesight channel (the project's page)
SECRETS_PATH = "/v1/realtime/client_secrets"
MAX_OFFER_BYTES = 64 * 1024
#: What OpenAI's Agents SDK sends with an offer (a preflight asks for them by name).
ALLOWED_HEADERS = ("authorization", "content-type", "x-openai-agents-sdk", "openai-beta", "x-api-key")



class OfferError(ValueError):
    """An offer that is not one (said as a 400)."""


def ice_servers(urls: list[str]) -> list[RTCIceServer]:
    """``stun:HOST:PORT`` / ``turn:USER:PASSWORD@HOST:PORT`` as aiortc's ICE servers."""
    servers = []
    for url in urls:
        scheme, _, rest = url.partition(":")
        credentials, at, host = rest.rpartition("@")
        if at:
            user, _, password = credentials.partition(":")
            servers.append(RTCIceServer(urls=f"{scheme}:{host}", username=user, credential=password))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


#: Consent checks (RFC 7675) missed in a row before a call's peer counts as vanished.
CONSENT_MISSES = 3


def time_out_vanished_peers(timeout_s: float) -> None:
    """Check a call's consent every quarter of ``timeout_s``, three misses in a row end it: a
    peer that vanished (closed its lid, lost its network) is noticed within about
    ``timeout_s``, not aioice's 30 s. aioice reads these module settings at each check (they
    are its only knobs), so they hold for every connection of the process."""
    aioice.ice.CONSENT_INTERVAL = timeout_s / (CONSENT_MISSES + 1)
    aioice.ice.CONSENT_FAILURES = CONSENT_MISSES


class Calls:
    """The server's calls by id, from their offer to their end."""

    def __init__(self, settings: Settings, access: AccessPolicy, admission: Admission, serve: ServeSession) -> None:
        self.settings = settings
        self.access = access
        self.admission = admission
        self.serve = serve
        self.limits = CallLimits(
            connect_timeout_s=settings.webrtc_connect_timeout_s,
            max_pending=settings.webrtc_max_pending_messages,
            max_buffered_bytes=settings.webrtc_max_buffered_bytes,
            max_audio_out_bytes=int(settings.webrtc_max_audio_out_s * SPEAKER_RATE * 2),
            frame_side=settings.webrtc_frame_side,
        )
        time_out_vanished_peers(settings.webrtc_peer_timeout_s)
        self.calls: dict[str, Call] = {}
        self.tg: TaskGroup | None = None  # the server's, set while it serves
        self.started = 0
        self.abandoned = 0
        self._ended_frames = {"decoded": 0, "not_decoded": 0, "keyframe_requests": 0}

    def camera_frames(self) -> dict[str, int]:
        """Camera frames of every call so far: sent to the decoder, never decoded, and the
        keyframes asked of the senders (``keyframes.KeyframeGate``)."""
        totals = dict(self._ended_frames)
        for call in self.calls.values():
            for name, value in _gate_counts(call).items():
                totals[name] += value
        return totals

    @property
    def connecting(self) -> int:
        return sum(not c.connected for c in self.calls.values())

    async def offer(self, sdp: str, session: dict[str, Any] | None, bound: dict[str, Any], owner: str,
                    v1: bool = False) -> Call:
        """Answer an offer: a new call, its session started once its data channel opens (the
        Realtime events, or with ``v1`` protocol v1's, which knows no bound session).
        Raises ``OfferError``."""
        assert self.tg is not None, "the server is not serving"
        if "m=" not in sdp or not sdp.lstrip().startswith("v="):
            raise OfferError("the body is not an SDP offer (application/sdp, starting with v=0)")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(self.settings.webrtc_ice_servers)))
        speaker = Speaker(self.limits.max_audio_out_bytes)
        codec: CallCodec | V1CallCodec
        if v1:
            codec = V1CallCodec(speaker, self.settings.max_message_bytes)
            session = bound = None
        else:
            codec = CallCodec(speaker, None, self.settings.max_message_bytes, bound or None)
        transport = CallTransport(self.limits, codec.label)
        call = Call("rtc_" + secrets.token_hex(16), pc, transport, codec, self.limits)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            if not any(t.kind == "audio" for t in pc.getTransceivers()) and not pc.sctp:
                raise OfferError("the offer has neither an audio track nor a data channel")
            if any(t.kind == "audio" for t in pc.getTransceivers()):
                pc.addTrack(speaker)
            await pc.setLocalDescription(await pc.createAnswer())
        except OfferError:
            await pc.close()
            raise
        except Exception as exc:  # noqa: BLE001 - aiortc's parser and negotiation raise many kinds
            await pc.close()
            raise OfferError(f"the offer could not be answered: {exc}") from None
        for update in (session, bound):  # the client's config, then the key's (which wins)
            if update:
                transport.preface(json.dumps({"type": "session.update", "session": update}))
        self.calls[call.call_id] = call
        self.started += 1
        self.tg.start_soon(self._run, call, partial(self.serve, transport, codec, owner))
        return call

    async def _run(self, call: Call, serve: Callable[[], Awaitable[None]]) -> None:
        try:
            await call.run(serve)
        except Exception:  # noqa: BLE001 - one call's failure must not end the server (its task group)
            log.exception("call %s failed", call.call_id)
        finally:
            self.abandoned += not call.connected
            self.calls.pop(call.call_id, None)
            for name, value in _gate_counts(call).items():
                self._ended_frames[name] += value

    def hang_up(self, call_id: str) -> bool:
        call = self.calls.get(call_id)
        if call is None:
            return False
        call.hang_up()
        return True


def _gate_counts(call: Call) -> dict[str, int]:
    gate = call.gate
    if gate is None:
        return {}
    return {"decoded": gate.passed, "not_decoded": gate.skipped, "keyframe_requests": gate.requests}


def _session_field(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        session = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        raise OfferError("session must be JSON (a Realtime session config)") from None
    if not isinstance(session, dict):
        raise OfferError("session must be an object (a Realtime session config)")
    return session


def realtime_session(session: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Realtime session config, checked whole (raises ``OfferError``)."""
    if session is None:
        return None
    try:
        rtc.RealtimeSession.model_validate(session)
    except ValidationError as exc:
        raise OfferError(f"session is not a valid Realtime session: {exc.errors()[0]['msg']}") from None
    return session


async def read_offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """The offer's SDP and session config: ``application/sdp``, or multipart with ``sdp`` and
    ``session`` fields. Raises ``OfferError``."""
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_OFFER_BYTES:
        raise OfferError(f"an offer is at most {MAX_OFFER_BYTES} bytes")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form(max_files=2, max_fields=4, max_part_size=MAX_OFFER_BYTES)
        sdp = form.get("sdp")
        if isinstance(sdp, str) or sdp is None:
            text = sdp
        else:
            text = (await sdp.read(MAX_OFFER_BYTES + 1)).decode("utf-8", "replace")
        session = form.get("session")
        session_raw = session if isinstance(session, str) or session is None else await session.read(MAX_OFFER_BYTES)
        if not text:
            raise OfferError("the multipart offer has no sdp field")
        return text, realtime_session(_session_field(session_raw))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_OFFER_BYTES:
            raise OfferError(f"an offer is at most {MAX_OFFER_BYTES} bytes")
    if kind not in ("application/sdp", "text/plain", ""):
        raise OfferError("send the offer as application/sdp (or multipart/form-data with sdp and session)")
    try:
        return bytes(body).decode("utf-8"), None
    except UnicodeDecodeError:
        raise OfferError("the offer is not UTF-8 text") from None


def _cors(request: Request, access: AccessPolicy) -> tuple[dict[str, str], bool]:
    """The CORS headers for a request (none without ``Origin``) and whether it may go on:
    a page of another origin only when ``allowed_origins`` admits it."""
    origin = request.headers.get("origin")
    if origin is None or same_origin(origin, request.headers):
        return {}, True
    if not access.origin_listed(origin):
        return {"Vary": "Origin"}, False
    return {
        "Access-Control-Allow-Origin": origin, "Vary": "Origin",
        "Access-Control-Expose-Headers": "Location",
    }, True


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": "invalid_request_error", "code": code, "message": message}},
                        status_code=status, headers=headers)


def add_call_routes(app: FastAPI, calls: Calls, access: AccessPolicy, draining: Callable[[], bool]) -> None:
    """The call and client-secret routes."""

    async def preflight(request: Request) -> Response:
        cors, allowed = _cors(request, access)
        if not allowed or not cors:
            return Response(status_code=403, headers=cors)
        asked = [h.strip().lower() for h in request.headers.get("access-control-request-headers", "").split(",")
                 if h.strip()]
        if any(h not in ALLOWED_HEADERS for h in asked):
            return Response(status_code=403, headers=cors)
        return Response(status_code=204, headers={
            **cors, "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": ", ".join(ALLOWED_HEADERS), "Access-Control-Max-Age": "600",
        })

    def call_routes(path: str, v1: bool) -> None:
        async def create_call(request: Request) -> Response:
            cors, allowed = _cors(request, access)
            if not allowed:
                return _error(403, "forbidden_origin", "this origin may not call", cors)
            if not access.http_key(request.headers, request.query_params):
                return _error(401, "unauthorized", "a valid API key (or ephemeral key) is required", cors)
            secret = access.secret(request.headers, request.query_params)
            if draining():
                return _error(503, "server_closing", "the server is shutting down; call again", cors)
            if calls.connecting >= calls.settings.max_pending_connections:
                return _error(503, "too_many_sessions", "too many calls are connecting; try again", cors)
            if len(calls.admission.active) >= calls.admission.max_sessions:
                return _error(503, "too_many_sessions",
                              f"the server is at its limit of {calls.admission.max_sessions} sessions", cors)
            try:
                sdp, session = await read_offer(request)
                call = await calls.offer(sdp, session, secret.session if secret is not None else {},
                                         access.owner(request.headers, request.query_params), v1=v1)
            except OfferError as exc:
                return _error(400, "invalid_offer", str(exc), cors)
            return Response(call.pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                            headers={**cors, "Location": f"{path}/{call.call_id}"})

        async def hang_up(call_id: str, request: Request) -> Response:
            cors, allowed = _cors(request, access)
            if not allowed:
                return _error(403, "forbidden_origin", "this origin may not call", cors)
            if not access.http_key(request.headers, request.query_params):
                return _error(401, "unauthorized", "a valid API key (or ephemeral key) is required", cors)
            if not calls.hang_up(call_id):
                return _error(404, "call_not_found", "no such call (it ended, or never was)", cors)
            return JSONResponse({}, headers=cors)

        app.add_api_route(path, preflight, methods=["OPTIONS"], include_in_schema=False)
        app.add_api_route(path + "/{call_id}/hangup", preflight, methods=["OPTIONS"], include_in_schema=False)
        app.add_api_route(path, create_call, methods=["POST"])
        app.add_api_route(path + "/{call_id}/hangup", hang_up, methods=["POST"])

    call_routes(CALLS_PATH, v1=False)
    call_routes(V1_CALLS_PATH, v1=True)

    @app.post(SECRETS_PATH)
    async def client_secret(request: Request) -> Response:
        if not access.real_key(request.headers, request.query_params):
            return _error(401, "unauthorized", "minting a key takes an API key (not an ephemeral one)")
        body = await request.body()
        if len(body) > MAX_OFFER_BYTES:
            return _error(400, "invalid_request", f"the body is at most {MAX_OFFER_BYTES} bytes")
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ClientSecretError("the body must be a JSON object")
            session = realtime_session(_session_field(data.get("session")))
            secret = access.client_secrets.mint({**data, "session": session}, access.owner(request.headers, request.query_params))
        except (ValueError, OfferError) as exc:
            return _error(400, "invalid_request", str(exc))
        return JSONResponse({"value": secret.value, "expires_at": secret.expires_at,
                             "session": {"type": "realtime", **secret.session}})
