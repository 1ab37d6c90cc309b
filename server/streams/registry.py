"""The server's streams and their HTTP API: ``POST /v1/streams`` (a camera the server pulls,
with its session config, watches and delivery), ``GET /v1/streams[/{id}]``, ``PATCH`` (watches,
delivery), ``DELETE``; ``GET /v1/streams/{id}/events`` (Server-Sent Events, resumable with
``Last-Event-ID``) and ``GET /v1/streams/{id}/moments/{moment}.jpg`` (a fire's evidence).

Same auth as sessions; a stream belongs to the key that created it (another key gets 404).
At most ``max_streams`` at a time (``429`` past that). A stream created through the API is
kept in the outbox's database until deleted and pulled again after a restart. Streams given at
start (``livesight serve --streams FILE``, YAML or JSON: a list of the POST bodies, or
``{"streams": [...]}``) belong to no key and come from the file each time.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import yaml
from anyio.abc import TaskGroup
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from handlers.wire.client_events import parse_client_event
from handlers.wire.errors import SessionError
from server.auth import AccessPolicy
from server.streams.delivery import payload
from server.streams.mqtt import MqttLink
from server.streams.outbox import Outbox
from server.streams.source import checked_url
from handlers.session.transport import ServeSession
from server.streams.stream import Stream, StreamLimits, StreamSettings

log = logging.getLogger("livesight.streams")

STREAMS_PATH = "/v1/streams"
MAX_BODY_BYTES = 256 * 1024
#: How often an idle event stream says it is alive (an SSE comment).
SSE_KEEPALIVE_S = 15.0


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000, pattern=r"^https?://")
    secret: str | None = Field(None, min_length=8, max_length=500)


class Mqtt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    topic: str = Field(max_length=500, pattern=r"^[^#+\x00]+$")


class Deliver(BaseModel):
    model_config = ConfigDict(extra="forbid")
    webhook: Webhook | None = None
    mqtt: Mqtt | None = None


class StreamBody(BaseModel):
    """``POST /v1/streams``."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(max_length=2000)
    name: str | None = Field(None, max_length=200)
    fps: float = Field(2.0, gt=0, le=30)
    loop: bool = False
    lookback_s: float = Field(5.0, ge=0, le=300)
    config: dict[str, Any] = Field(default_factory=dict)
    watches: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    deliver: Deliver = Field(default_factory=Deliver)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return checked_url(value)


class StreamPatch(BaseModel):
    """``PATCH /v1/streams/{id}``: the watches (all of them, replacing the old) and/or delivery."""

    model_config = ConfigDict(extra="forbid")
    watches: list[dict[str, Any]] | None = Field(None, max_length=64)
    deliver: Deliver | None = None


def _checked_config(config: dict[str, Any], watches: list[dict[str, Any]]) -> None:
    """Raises ``ValueError`` when the session config and watches are not a valid v1 config."""
    if "watches" in config or "type" in config:
        raise ValueError("config holds the session's settings: watches go in watches")
    try:
        parse_client_event(json.dumps({"type": "session.config", **config, "watches": watches}))
    except SessionError as exc:
        raise ValueError(exc.message) from None


def _settings(body: StreamBody) -> StreamSettings:
    _checked_config(body.config, body.watches)
    return StreamSettings(body.source, body.name, body.fps, body.loop, body.lookback_s, body.config,
                          body.watches, body.deliver.model_dump(exclude_none=True))


class Streams:
    """The server's streams by id (``tg``: the server's task group, set while it serves)."""

    def __init__(self, outbox: Outbox, limits: StreamLimits, max_streams: int, serve: ServeSession,
                 max_message_bytes: int | None = None, mqtt: MqttLink | None = None) -> None:
        self.outbox = outbox
        self.mqtt = mqtt
        if mqtt is not None:
            mqtt.on_connect = self.announce
        self.limits = limits
        self.max_streams = max_streams
        self.serve = serve
        self.max_message_bytes = max_message_bytes
        self.streams: dict[str, Stream] = {}
        self.tg: TaskGroup | None = None

    def create(self, settings: StreamSettings, owner: str, stream_id: str | None = None) -> Stream:
        """Start a stream. Raises ``OverflowError`` at ``max_streams``."""
        assert self.tg is not None, "the server is not serving"
        if len(self.streams) >= self.max_streams:
            raise OverflowError(f"the server pulls at most {self.max_streams} streams")
        self.check_delivery(settings.deliver)
        stream = Stream(stream_id or "str_" + secrets.token_hex(8), settings, owner, self.limits, self.outbox,
                        self.max_message_bytes, self.mqtt)
        self.streams[stream.stream_id] = stream
        self.tg.start_soon(self._run, stream)
        return stream

    async def _run(self, stream: Stream) -> None:
        try:
            await stream.run(self.serve)
        except Exception:  # noqa: BLE001 - one stream's failure must not end the server
            log.exception("stream %s failed", stream.stream_id)
            stream.state = "failed"

    async def keep(self, stream: Stream) -> None:
        """Keep a stream created through the API (its settings as they are now)."""
        stream.kept = True
        await self.outbox.keep_stream(stream.stream_id, stream.owner, asdict(stream.settings))

    async def restore(self) -> None:
        """Pull again the streams kept before a restart (those that no longer fit, or no longer
        check out, are logged and left kept)."""
        for stream_id, owner, kept in await self.outbox.kept_streams():
            try:
                self.create(StreamSettings(**kept), owner, stream_id).kept = True
            except (OverflowError, ValueError, TypeError) as exc:
                log.warning("stream %s kept from before is not pulled: %s", stream_id, exc)

    def check_delivery(self, deliver: dict[str, Any]) -> None:
        """Raises ``ValueError`` for a channel this server cannot deliver to."""
        if deliver.get("mqtt") and self.mqtt is None:
            raise ValueError("deliver.mqtt: this server has no MQTT broker (set mqtt_url)")

    async def announce(self) -> None:
        """Every stream's watches over MQTT (the broker has just connected)."""
        for stream in list(self.streams.values()):
            await stream.announce()

    def get(self, stream_id: str, owner: str) -> Stream | None:
        stream = self.streams.get(stream_id)
        return stream if stream is not None and (stream.owner == "" or stream.owner == owner) else None

    async def delete(self, stream: Stream) -> None:
        stream.stop()
        self.streams.pop(stream.stream_id, None)
        await self.outbox.forget(stream.stream_id)

    def patch(self, stream: Stream, patch: StreamPatch) -> None:
        """New watches replace the old (each deleted, each new one created); new delivery
        settings apply to the events after."""
        if patch.watches is not None:
            _checked_config(stream.settings.config, patch.watches)
            for watch_id in list(stream.conditions):
                stream.transport.control({"type": "watch.delete", "watch_id": watch_id})
            for watch in patch.watches:
                stream.transport.control({"type": "watch.create", **watch})
            stream.settings.watches = list(patch.watches)
        if patch.deliver is not None:
            deliver = patch.deliver.model_dump(exclude_none=True)
            self.check_delivery(deliver)
            stream.settings.deliver = deliver
            stream.announce_soon()

    def stop_all(self) -> None:
        for stream in self.streams.values():
            stream.stop()


def load_streams_file(path: Path) -> list[StreamSettings]:
    """The streams of a file given at start (YAML or JSON). Raises ``ValueError`` saying which
    entry is wrong."""
    data = yaml.safe_load(path.read_text())
    entries = data.get("streams") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of streams (or {{streams: [...]}})")
    out = []
    for n, entry in enumerate(entries):
        try:
            out.append(_settings(StreamBody.model_validate(entry)))
        except (ValidationError, ValueError) as exc:
            raise ValueError(f"{path}: stream {n + 1}: {exc}") from None
    return out


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ValueError(f"the body is at most {MAX_BODY_BYTES} bytes")
    data = json.loads(raw or b"{}")
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def add_stream_routes(app: FastAPI, streams: Streams, access: AccessPolicy, draining: Callable[[], bool]) -> None:
    """The stream routes."""

    def owner_of(request: Request) -> str | None:
        """The caller's owner digest, or None when its key is refused."""
        if not access.http_key(request.headers, request.query_params):
            return None
        return access.owner(request.headers, request.query_params)

    def found(request: Request, stream_id: str) -> Stream | JSONResponse:
        owner = owner_of(request)
        if owner is None:
            return _error(401, "unauthorized", "a valid API key is required")
        stream = streams.get(stream_id, owner)
        return stream if stream is not None else _error(404, "stream_not_found", "no such stream")

    @app.post(STREAMS_PATH)
    async def create(request: Request) -> Response:
        owner = owner_of(request)
        if owner is None:
            return _error(401, "unauthorized", "a valid API key is required")
        if draining():
            return _error(503, "server_closing", "the server is shutting down")
        try:
            settings = _settings(StreamBody.model_validate(await _body(request)))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return _error(400, "invalid_stream", f"{where}: {first['msg']}" if where else first["msg"])
        except ValueError as exc:
            return _error(400, "invalid_stream", str(exc))
        try:
            stream = streams.create(settings, owner)
        except OverflowError as exc:
            return _error(429, "too_many_streams", str(exc))
        except ValueError as exc:
            return _error(400, "invalid_stream", str(exc))
        await streams.keep(stream)
        return JSONResponse(stream.status(), status_code=201,
                            headers={"Location": f"{STREAMS_PATH}/{stream.stream_id}"})

    @app.get(STREAMS_PATH)
    async def listing(request: Request) -> Response:
        owner = owner_of(request)
        if owner is None:
            return _error(401, "unauthorized", "a valid API key is required")
        mine = [s for s in streams.streams.values() if s.owner in ("", owner)]
        return JSONResponse({"streams": [s.status() for s in mine]})

    @app.get(STREAMS_PATH + "/{stream_id}")
    async def one(stream_id: str, request: Request) -> Response:
        stream = found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        return JSONResponse({**stream.status(), "deliveries": await streams.outbox.counts(stream_id)})

    @app.patch(STREAMS_PATH + "/{stream_id}")
    async def patch(stream_id: str, request: Request) -> Response:
        stream = found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        try:
            streams.patch(stream, StreamPatch.model_validate(await _body(request)))
        except ValidationError as exc:
            return _error(400, "invalid_stream", exc.errors()[0]["msg"])
        except ValueError as exc:
            return _error(400, "invalid_stream", str(exc))
        if stream.kept:  # one of the API's (a stream of the file comes from the file)
            await streams.keep(stream)
        return JSONResponse(stream.status())

    @app.delete(STREAMS_PATH + "/{stream_id}")
    async def delete(stream_id: str, request: Request) -> Response:
        stream = found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        await streams.delete(stream)
        return Response(status_code=204)

    @app.get(STREAMS_PATH + "/{stream_id}/moments/{moment}.jpg")
    async def moment(stream_id: str, moment: str, request: Request) -> Response:
        stream = found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        event_id, _, n = moment.rpartition("-")
        jpeg = await streams.outbox.evidence(stream_id, event_id, int(n)) if n.isdigit() else None
        if jpeg is None:
            return _error(404, "moment_not_found", "no such moment")
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})

    @app.get(STREAMS_PATH + "/{stream_id}/events")
    async def events(stream_id: str, request: Request) -> Response:
        stream = found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id") or "0"
        try:
            after = int(last)
        except ValueError:
            return _error(400, "invalid_request", "Last-Event-ID is the id of an event this stream sent")
        return StreamingResponse(_sse(streams.outbox, stream_id, after), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _sse(outbox: Outbox, stream_id: str, after: int) -> AsyncIterator[bytes]:
    """A stream's events after ``after``, then each new one as it is kept."""
    yield b": livesight stream events\n\n"
    while True:
        added = outbox.added
        batch = await outbox.after(stream_id, after)
        for event in batch:
            after = event.seq
            yield f"id: {event.seq}\nevent: {event.kind}\ndata: ".encode() + payload(event) + b"\n\n"
        if batch:
            continue
        with anyio.move_on_after(SSE_KEEPALIVE_S) as waited:
            await added.wait()
        if waited.cancelled_caught:
            yield b": keepalive\n\n"
