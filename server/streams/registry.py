"""The server's streams and their HTTP API: ``POST /v1/streams`` (a camera the server pulls,
with its session config, watches and delivery), ``GET /v1/streams[/{id}]``, ``PATCH`` (watches,
delivery), ``DELETE``; ``GET /v1/streams/{id}/events`` (Server-Sent Events, resumable with
``Last-Event-ID``) and ``GET /v1/streams/{id}/moments/{moment}.jpg`` (a fire's evidence).

Same auth as sessions; a stream belongs to the key that created it (another key gets 404).
A server pulls at most ``max_streams`` at a time (``429`` past that). Every stream is kept in
the outbox's database until deleted, and pulled by the server that holds its lease: after a
restart, or by another server sharing the database when its own stops or dies. Any of those
servers answers for any stream (its status as its server last said, its events and evidence from
the database; a change applied at its server's next lease round). Streams given at start
(``livesight serve --streams FILE``, YAML or JSON: a list of the POST bodies, or
``{"streams": [...]}``) belong to no key; the file names them (a stream dropped from the file is
dropped from the database).
"""

from __future__ import annotations

import hashlib
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
from server.streams.outbox import KeptStream, Outbox
from server.streams.source import checked_url
from handlers.session.transport import ServeSession
from server.streams.stream import Stream, StreamLimits, StreamSettings, redacted

log = logging.getLogger("livesight.streams")

#: How long after another server's lease runs out this one's next round comes.
LEASE_SLACK_S = 0.05

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
    """The streams this server pulls, by id, and the lease rounds that say which (``tg``: the
    server's task group, set while it serves). Every stream is kept in the outbox's database;
    servers sharing it each pull the streams they hold (see ``outbox.py``)."""

    def __init__(self, outbox: Outbox, limits: StreamLimits, max_streams: int, serve: ServeSession,
                 max_message_bytes: int | None = None, mqtt: MqttLink | None = None, lease_s: float = 15.0) -> None:
        self.outbox = outbox
        self.mqtt = mqtt
        if mqtt is not None:
            mqtt.on_connect = self.announce
        self.limits = limits
        self.max_streams = max_streams
        self.serve = serve
        self.max_message_bytes = max_message_bytes
        self.lease_s = lease_s
        self.server_id = "srv_" + secrets.token_hex(6)  # this server's name on its leases
        self.streams: dict[str, Stream] = {}
        self.revisions: dict[str, int] = {}  # the settings' revision each stream runs
        self.tg: TaskGroup | None = None
        self._round = anyio.Lock()
        self._closing = False

    def create(self, settings: StreamSettings, owner: str, stream_id: str | None = None) -> Stream:
        """Start pulling a stream here. Raises ``OverflowError`` at ``max_streams``."""
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

    async def start(self, settings: StreamSettings, owner: str) -> Stream:
        """A new stream of the API: pulled here and kept under this server's lease, between two
        lease rounds (a round in between would find it in no lease and stop it). Raises
        ``OverflowError`` at ``max_streams``, ``ValueError`` for settings that do not check out."""
        async with self._round:
            stream = self.create(settings, owner)
            try:
                await self.keep(stream)
            except BaseException:
                stream.stop()
                self.streams.pop(stream.stream_id, None)
                raise
            return stream

    async def keep(self, stream: Stream) -> None:
        """Keep a stream's settings as they are now (a new one under this server's lease)."""
        self.revisions[stream.stream_id] = await self.outbox.keep_stream(
            stream.stream_id, stream.owner, asdict(stream.settings), self.server_id, self.lease_s)

    async def give(self, given: list[StreamSettings]) -> None:
        """The streams of the streams file: kept under ids their settings make (the same file
        names the same streams on every server sharing the database)."""
        await self.outbox.given_streams({given_id(settings): asdict(settings) for settings in given})

    async def hold(self) -> None:
        """Lease rounds for the server's life: the first at once, then every third of ``lease_s``,
        or sooner, just after another server's lease runs out (while this one has room): a dead
        server's stream moves within a lease time of its last renewal."""
        while not self._closing:
            wait_s = self.lease_s / 3
            try:
                expiry_s = await self.hold_round()
                if expiry_s is not None and len(self.streams) < self.max_streams:
                    wait_s = min(wait_s, expiry_s + LEASE_SLACK_S)
            except Exception as exc:  # noqa: BLE001 - the database is away: the next round tries again
                log.warning("streams: a lease round failed: %r", exc)
            await anyio.sleep(wait_s)

    async def hold_round(self) -> float | None:
        """Renew the leases of the streams pulled here (stopping those lost or deleted
        elsewhere, applying settings changed elsewhere) and take free streams while there is room.
        Returns the seconds until another server's first lease runs out (None: none)."""
        async with self._round:
            if self._closing:
                return None
            statuses = {stream_id: stream.status() for stream_id, stream in self.streams.items()}
            holding = await self.outbox.hold(self.server_id, statuses, self.max_streams - len(self.streams),
                                             self.lease_s)
            changed = [sid for sid, revision in holding.revisions.items() if self.revisions.get(sid) != revision]
            for stream_id in statuses.keys() - holding.revisions.keys():
                log.info("stream %s: no longer this server's (deleted, or its lease ran out)", stream_id)
                self.streams.pop(stream_id).stop()
                self.revisions.pop(stream_id, None)
            if changed:
                kept = {k.stream_id: k for k in await self.outbox.kept_streams()}
                for stream_id in changed:
                    if stream_id in kept and stream_id in self.streams:
                        self._apply(self.streams[stream_id], StreamSettings(**kept[stream_id].settings))
                        self.revisions[stream_id] = kept[stream_id].revision
            for taken in holding.taken:
                try:
                    self.create(StreamSettings(**taken.settings), taken.owner, taken.stream_id)
                    self.revisions[taken.stream_id] = taken.revision
                except (OverflowError, ValueError, TypeError) as exc:
                    log.warning("stream %s is kept but not pulled: %s", taken.stream_id, exc)
            return holding.next_expiry_s

    async def close(self) -> None:
        """Stop every stream and free their leases for the other servers at once."""
        async with self._round:
            self._closing = True
            for stream in self.streams.values():
                stream.stop()
            with anyio.CancelScope(shield=True):
                try:
                    await self.outbox.release(self.server_id)
                except Exception as exc:  # noqa: BLE001 - the leases then run out instead
                    log.warning("streams: leases not released: %r", exc)

    def check_delivery(self, deliver: dict[str, Any]) -> None:
        """Raises ``ValueError`` for a channel this server cannot deliver to."""
        if deliver.get("mqtt") and self.mqtt is None:
            raise ValueError("deliver.mqtt: this server has no MQTT broker (set mqtt_url)")

    async def announce(self) -> None:
        """Every stream's watches over MQTT (the broker has just connected)."""
        for stream in list(self.streams.values()):
            await stream.announce()

    def get(self, stream_id: str, owner: str) -> Stream | None:
        """A stream pulled here, when ``owner`` may see it."""
        stream = self.streams.get(stream_id)
        return stream if stream is not None and _mine(stream.owner, owner) else None

    async def find(self, stream_id: str, owner: str) -> Stream | KeptStream | None:
        """A stream pulled here, or one kept in the database that another server pulls (or
        none yet), when ``owner`` may see it."""
        local = self.get(stream_id, owner)
        if local is not None:
            return local
        kept = next((k for k in await self.outbox.kept_streams() if k.stream_id == stream_id), None)
        return kept if kept is not None and _mine(kept.owner, owner) else None

    async def listing(self, owner: str) -> list[dict[str, Any]]:
        """The statuses of every stream ``owner`` may see, wherever it is pulled."""
        out = []
        for kept in await self.outbox.kept_streams():
            if _mine(kept.owner, owner):
                local = self.streams.get(kept.stream_id)
                out.append(self.status(local if local is not None else kept))
        return out

    def status(self, stream: Stream | KeptStream) -> dict[str, Any]:
        """A stream's status; for one pulled elsewhere, what its server said at its last
        renewal (``waiting`` while no server holds it)."""
        if isinstance(stream, Stream):
            return {**stream.status(), "server": self.server_id}
        if stream.held and stream.status:
            return {**stream.status, "server": stream.holder}
        settings = StreamSettings(**stream.settings)
        return {"stream_id": stream.stream_id, "name": settings.name, "source": redacted(settings.source),
                "state": "waiting", "server": None,
                "watches": [{"watch_id": w.get("watch_id"), "condition": w.get("condition")} for w in settings.watches]}

    async def delete(self, stream: Stream | KeptStream) -> None:
        """Delete a stream (one pulled elsewhere stops there at its server's next lease round)."""
        if isinstance(stream, Stream):
            stream.stop()
            self.streams.pop(stream.stream_id, None)
            self.revisions.pop(stream.stream_id, None)
        await self.outbox.forget(stream.stream_id)

    async def patch(self, stream: Stream | KeptStream, patch: StreamPatch) -> dict[str, Any]:
        """New watches replace the old and/or new delivery settings apply to the events after;
        kept at once, applied here or at the stream's server's next lease round. Returns its status."""
        current = stream.settings if isinstance(stream, Stream) else StreamSettings(**stream.settings)
        changed = StreamSettings(**{**asdict(current)})
        if patch.watches is not None:
            _checked_config(current.config, patch.watches)
            changed.watches = list(patch.watches)
        if patch.deliver is not None:
            changed.deliver = patch.deliver.model_dump(exclude_none=True)
            self.check_delivery(changed.deliver)
        if isinstance(stream, Stream):
            self._apply(stream, changed)
            await self.keep(stream)
            return self.status(stream)
        await self.outbox.keep_stream(stream.stream_id, stream.owner, asdict(changed), None, self.lease_s)
        status = self.status(stream)
        return {**status, "watches": [{"watch_id": w.get("watch_id"), "condition": w.get("condition")}
                                      for w in changed.watches]}

    @staticmethod
    def _apply(stream: Stream, settings: StreamSettings) -> None:
        """A running stream takes new watches (each old one deleted, each new one created) and
        delivery settings."""
        if settings.watches != stream.settings.watches:
            for watch_id in list(stream.conditions):
                stream.transport.control({"type": "watch.delete", "watch_id": watch_id})
            for watch in settings.watches:
                stream.transport.control({"type": "watch.create", **watch})
            stream.settings.watches = list(settings.watches)
        if settings.deliver != stream.settings.deliver:
            stream.settings.deliver = dict(settings.deliver)
            stream.announce_soon()


def _mine(stream_owner: str, owner: str) -> bool:
    """A stream of the streams file (no owner) is every key's; another belongs to its key."""
    return stream_owner == "" or stream_owner == owner


def given_id(settings: StreamSettings) -> str:
    """The id of a stream of the streams file: a digest of its settings."""
    digest = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()
    return "str_" + digest[:16]


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

    async def found(request: Request, stream_id: str) -> Stream | KeptStream | JSONResponse:
        owner = owner_of(request)
        if owner is None:
            return _error(401, "unauthorized", "a valid API key is required")
        stream = await streams.find(stream_id, owner)
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
            stream = await streams.start(settings, owner)
        except OverflowError as exc:
            return _error(429, "too_many_streams", str(exc))
        except ValueError as exc:
            return _error(400, "invalid_stream", str(exc))
        return JSONResponse(streams.status(stream), status_code=201,
                            headers={"Location": f"{STREAMS_PATH}/{stream.stream_id}"})

    @app.get(STREAMS_PATH)
    async def listing(request: Request) -> Response:
        owner = owner_of(request)
        if owner is None:
            return _error(401, "unauthorized", "a valid API key is required")
        return JSONResponse({"streams": await streams.listing(owner)})

    @app.get(STREAMS_PATH + "/{stream_id}")
    async def one(stream_id: str, request: Request) -> Response:
        stream = await found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        return JSONResponse({**streams.status(stream), "deliveries": await streams.outbox.counts(stream_id)})

    @app.patch(STREAMS_PATH + "/{stream_id}")
    async def patch(stream_id: str, request: Request) -> Response:
        stream = await found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        try:
            status = await streams.patch(stream, StreamPatch.model_validate(await _body(request)))
        except ValidationError as exc:
            return _error(400, "invalid_stream", exc.errors()[0]["msg"])
        except ValueError as exc:
            return _error(400, "invalid_stream", str(exc))
        return JSONResponse(status)

    @app.delete(STREAMS_PATH + "/{stream_id}")
    async def delete(stream_id: str, request: Request) -> Response:
        stream = await found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        await streams.delete(stream)
        return Response(status_code=204)

    @app.get(STREAMS_PATH + "/{stream_id}/moments/{moment}.jpg")
    async def moment(stream_id: str, moment: str, request: Request) -> Response:
        stream = await found(request, stream_id)
        if isinstance(stream, Response):
            return stream
        event_id, _, n = moment.rpartition("-")
        jpeg = await streams.outbox.evidence(stream_id, event_id, int(n)) if n.isdigit() else None
        if jpeg is None:
            return _error(404, "moment_not_found", "no such moment")
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})

    @app.get(STREAMS_PATH + "/{stream_id}/events")
    async def events(stream_id: str, request: Request) -> Response:
        stream = await found(request, stream_id)
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
