"""Access control at the WebSocket boundary: API keys, allowed origins, the open-server warning."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from server.app import create_app
from server.auth import AccessPolicy, warn_if_open
from server.background import RunningServer, run_server
from server.settings import Settings
from tests.scripted import ScriptedEngine

pytestmark = pytest.mark.anyio

KEYS = "key-one,key-two"


@pytest.fixture(scope="module")
def guarded() -> Iterator[RunningServer]:
    """A server that wants an API key and only lets one browser origin in (scripted engine)."""
    settings = Settings(api_keys=KEYS, allowed_origins="https://app.example")
    with run_server(settings, engine=ScriptedEngine()) as running:
        yield running


async def _open(server: RunningServer, query: str = "", **kwargs: Any) -> tuple[Any, dict]:
    """Connect, send session.config and return the socket and the server's first message."""
    ws = await websockets.connect(server.ws_url + query, **kwargs)
    try:
        await ws.send(json.dumps({"type": "session.config"}))
    except websockets.ConnectionClosed:
        pass  # refused: the error event is already waiting
    return ws, json.loads(await ws.recv())


async def _assert_refused(ws: Any, first: dict, code: str) -> None:
    assert first["type"] == "error" and first["code"] == code and first["closes_session"] is True
    with pytest.raises(websockets.ConnectionClosed):
        await ws.recv()
    assert ws.close_code == 1008


async def test_connection_without_key_is_refused(guarded: RunningServer) -> None:
    """No key: an unauthorized error, then the socket closes with 1008."""
    ws, first = await _open(guarded)
    await _assert_refused(ws, first, "unauthorized")


async def test_wrong_key_is_refused(guarded: RunningServer) -> None:
    """A key that is not configured is refused like a missing one."""
    ws, first = await _open(guarded, additional_headers={"Authorization": "Bearer key-three"})
    await _assert_refused(ws, first, "unauthorized")


@pytest.mark.parametrize(
    ("query", "kwargs"),
    [
        ("", {"additional_headers": {"Authorization": "Bearer key-one"}}),
        ("", {"additional_headers": {"X-API-Key": "key-two"}}),
        ("?api_key=key-one", {}),
    ],
    ids=["bearer", "x-api-key", "query"],
)
async def test_key_in_header_or_query_opens_session(guarded: RunningServer, query: str, kwargs: dict) -> None:
    """A configured key in Authorization, X-API-Key or ?api_key= opens a session."""
    ws, first = await _open(guarded, query, **kwargs)
    assert first["type"] == "session.ready"
    await ws.close()


async def test_key_as_subprotocol_for_browsers(guarded: RunningServer) -> None:
    """Browsers offer livesight.v1 and livesight.api-key.KEY; the server selects livesight.v1."""
    ws, first = await _open(guarded, subprotocols=["livesight.v1", "livesight.api-key.key-two"])
    assert first["type"] == "session.ready" and ws.subprotocol == "livesight.v1"
    await ws.close()


async def test_foreign_origin_is_refused(guarded: RunningServer) -> None:
    """A browser page from an origin not in allowed_origins is refused, even with a good key."""
    ws, first = await _open(
        guarded, origin="https://evil.example", additional_headers={"X-API-Key": "key-one"}
    )
    await _assert_refused(ws, first, "forbidden_origin")


async def test_allowed_origin_is_let_in(guarded: RunningServer) -> None:
    """The listed origin (any case, trailing slash) connects."""
    ws, first = await _open(guarded, origin="https://APP.example", additional_headers={"X-API-Key": "key-one"})
    assert first["type"] == "session.ready"
    await ws.close()


async def test_metrics_need_the_key_health_does_not(guarded: RunningServer) -> None:
    """/metrics is behind the key; /healthz stays open for load balancers."""
    async with httpx.AsyncClient(base_url=guarded.http_url) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics.json")).status_code == 401
        assert (await http.get("/metrics", headers={"X-API-Key": "key-two"})).status_code == 200


def test_keys_compare_whole() -> None:
    """Only an exact key matches: no prefix, no extension, no empty key."""
    policy = AccessPolicy(["secret"])
    assert policy.key_matches("secret")
    assert not any(policy.key_matches(k) for k in ("secre", "secrets", "", None, "SECRET"))


def test_open_server_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Listening beyond loopback with no key logs a warning; loopback or a key does not."""
    with caplog.at_level(logging.WARNING, logger="livesight.server"):
        create_app(Settings(host="0.0.0.0"), engine=ScriptedEngine())
    assert any("no API key" in r.getMessage() for r in caplog.records)
    assert not warn_if_open("127.0.0.1", AccessPolicy())
    assert not warn_if_open("::1", AccessPolicy())
    assert not warn_if_open("0.0.0.0", AccessPolicy(["k"]))
    assert warn_if_open("example.org", AccessPolicy())
