"""The Gemini Live endpoint over a raw WebSocket (TLS), for what the SDK cannot send: keys in
the query, transparent resumption, livesight's watches (proactive answers), and hostile
input. Each bad message gets what docs/gemini-live.md says (a close code with a reason, or
skipped with the session going on), and a bystander session is never affected."""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import websockets
from google.genai import types
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server.app import LIVE_PATHS
from server.background import RunningServer
from tests.socket.live.conftest import API_KEY
from tests.protocol_client import jpeg_frame

pytestmark = pytest.mark.anyio

ASK_PACE_S = 0.15  # between one connection's questions: under the default answer budget of 10 a second
TEXT_SETUP = {"setup": {"model": "models/livesight",
                        "generationConfig": {"responseModalities": ["TEXT"], "maxOutputTokens": 2}}}


class Raw:
    """One raw Live connection; every message it reads parses strictly as ``LiveServerMessage``."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.asked_at = -math.inf

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def recv(self, timeout: float = 60) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            message = json.loads(await self.ws.recv())
        types.LiveServerMessage.model_validate(message)  # extra="forbid"
        return message

    async def until(self, done: Any, timeout: float = 60) -> list[dict[str, Any]]:
        out = []
        while True:
            out.append(await self.recv(timeout))
            if done(out[-1]):
                return out

    async def turn(self, timeout: float = 60) -> list[dict[str, Any]]:
        return await self.until(lambda m: m.get("serverContent", {}).get("turnComplete", False), timeout)

    async def closed(self, timeout: float = 60) -> tuple[int | None, str]:
        """Read until the server closes; its close code and reason."""
        try:
            while True:
                await self.recv(timeout)
        except websockets.ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")

    async def asks(self, seed: int) -> None:
        """A frame and a question answered to turnComplete: the session is usable. Questions
        are paced within the session's answer budget (``answer_rate_per_s``, 10 a second by
        default): one over it is skipped, as Live has no error event, and gets no turn."""
        await anyio.sleep(max(0.0, self.asked_at + ASK_PACE_S - time.monotonic()))
        self.asked_at = time.monotonic()
        await self.send(frame_message(jpeg_frame(seed)))
        await self.send({"realtimeInput": {"text": "What is it?"}})
        await self.turn()


def frame_message(jpeg: bytes, urlsafe: bool = True) -> dict[str, Any]:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return {"realtime_input": {"video": {"data": encode(jpeg).decode(), "mime_type": "image/jpeg"}}}


@asynccontextmanager
async def raw(server: RunningServer, ca: Path, query: str = "", headers: dict[str, str] | None = None,
              setup: dict[str, Any] | None = TEXT_SETUP) -> AsyncIterator[Raw]:
    """A raw connection (``setup`` sent and its setupComplete read, unless None)."""
    context = ssl.create_default_context(cafile=str(ca))
    url = f"wss://{server.host}:{server.port}{LIVE_PATHS[2]}{query}"
    async with websockets.connect(url, ssl=context, additional_headers=headers or {}, max_size=None,
                                  close_timeout=1) as ws:
        conn = Raw(ws)
        if setup is not None:
            await conn.send(setup)
            assert "setupComplete" in await conn.recv()
        yield conn


async def test_the_key_in_the_query_or_as_access_token(live_server: RunningServer, live_tls: tuple[Path, Path]) -> None:
    """?key= and ?access_token= open a session as x-goog-api-key does; a setupComplete
    parses as the SDK's own message."""
    for query in (f"?key={API_KEY}", f"?access_token={API_KEY}"):
        async with raw(live_server, live_tls[0], query) as conn:
            await conn.asks(1)
    async with raw(live_server, live_tls[0], headers={"Authorization": f"Token {API_KEY}"}) as conn:
        await conn.asks(2)


async def test_transparent_resumption_names_the_last_frame_taken(
    live_server: RunningServer, live_tls: tuple[Path, Path]
) -> None:
    """sessionResumption.transparent: after each frame taken, an update whose
    lastConsumedClientMessageIndex is that frame's message index (setup is message 0)."""
    setup = {"setup": {**TEXT_SETUP["setup"], "sessionResumption": {"transparent": True}}}
    async with raw(live_server, live_tls[0], f"?key={API_KEY}", setup=setup) as conn:
        first = await conn.recv()
        assert first["sessionResumptionUpdate"]["resumable"] is True
        await conn.send(frame_message(jpeg_frame(30)))
        await conn.send(frame_message(jpeg_frame(31), urlsafe=False))
        got = await conn.until(
            lambda m: m.get("sessionResumptionUpdate", {}).get("lastConsumedClientMessageIndex") == "2"
        )
        assert [m["sessionResumptionUpdate"]["lastConsumedClientMessageIndex"] for m in got] == ["1", "2"]


async def test_a_fired_watch_is_an_unasked_model_turn(live_server: RunningServer, live_tls: tuple[Path, Path]) -> None:
    """livesight.watches with proactivity.proactiveAudio: a watch that fires (threshold 0:
    at its first check) answers as a model turn the client did not ask for, to turnComplete."""
    watch = {"watch_id": "door", "condition": "Is anything there?", "threshold": 0.0, "clear_threshold": 0.0,
             "response": {"max_tokens": 3}}
    setup = {"setup": {**TEXT_SETUP["setup"], "proactivity": {"proactiveAudio": True},
                       "livesight": {"watches": [watch]}}}
    async with raw(live_server, live_tls[0], f"?key={API_KEY}", setup=setup) as conn:
        await conn.send(frame_message(jpeg_frame(40)))
        turn = await conn.turn()
        assert any("modelTurn" in m.get("serverContent", {}) for m in turn)
        assert turn[-1]["usageMetadata"]["responseTokenCount"] > 0


# --------------------------------------------------------------------------- hostile input

CLOSE_INVALID, CLOSE_POLICY, CLOSE_TOO_BIG, SKIPPED = 1007, 1008, 1009, "skipped"


def _recase(obj: Any, draw: Any) -> Any:
    """``obj`` with each key in camelCase or snake_case, drawn key by key."""
    from pydantic.alias_generators import to_camel

    if isinstance(obj, dict):
        return {(to_camel(k) if draw(st.booleans()) else k): _recase(v, draw) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_recase(v, draw) for v in obj]
    return obj


@st.composite
def hostile(draw: Any) -> tuple[str, bool, Any]:
    """(message, sent before setup, what must happen)."""
    kind = draw(st.sampled_from([
        "not_json", "not_object", "unknown_key", "two_messages", "wrong_type", "surrogate", "tool_response",
        "second_setup", "before_setup", "bad_base64", "bad_audio", "huge_frame", "mixed_case_ok", "nan",
        "over_message_limit",
    ]))
    jpeg = jpeg_frame(draw(st.integers(0, 50)))
    if kind == "not_json":
        return draw(st.sampled_from(["{", "realtimeInput", '{"realtimeInput": }', "\x00"])), False, CLOSE_INVALID
    if kind == "nan":
        return '{"realtimeInput": {"text": NaN}}', False, CLOSE_INVALID
    if kind == "not_object":
        return json.dumps(draw(st.sampled_from([[], 1, "setup", None, [{"setup": {}}]]))), False, CLOSE_INVALID
    if kind == "unknown_key":
        key = draw(st.sampled_from(["bogus", "realtime", "Setup", "serverContent"]))
        return json.dumps({key: {}}), False, CLOSE_INVALID
    if kind == "two_messages":
        both = {"realtimeInput": {"text": "a"}, "client_content": {"turnComplete": True}}
        return json.dumps(both), False, CLOSE_INVALID
    if kind == "wrong_type":
        bad = draw(st.sampled_from([
            {"realtimeInput": {"text": 5}}, {"realtime_input": {"video": {"data": 1}}},
            {"clientContent": {"turns": "hi"}}, {"clientContent": {"turn_complete": "true"}},
            {"realtimeInput": {"activity_start": []}}, {"realtimeInput": {"audioStreamEnd": 1}},
        ]))
        return json.dumps(_recase(bad, draw)), False, CLOSE_INVALID
    if kind == "surrogate":
        where = draw(st.sampled_from(["text", "key"]))
        message = {"realtimeInput": {"text": "\ud800x"}} if where == "text" else {"realtimeInput": {"te\udfffxt": "a"}}
        return json.dumps(message), draw(st.booleans()), CLOSE_INVALID
    if kind == "tool_response":
        tool = _recase({"tool_response": {"function_responses": [{"id": "1", "name": "f"}]}}, draw)
        return json.dumps(tool), False, CLOSE_POLICY
    if kind == "second_setup":
        return json.dumps(_recase({"setup": {"model": "m"}}, draw)), False, CLOSE_INVALID
    if kind == "before_setup":
        return json.dumps(frame_message(jpeg)), True, CLOSE_INVALID
    if kind == "bad_base64":
        data = base64.urlsafe_b64encode(jpeg).decode() if draw(st.booleans()) else base64.b64encode(jpeg).decode()
        cut = draw(st.integers(0, len(data) - 1))
        data = data[:cut] + draw(st.sampled_from(["!", "*", " ", "\\", "é", "====="])) + data[cut:]
        return json.dumps({"realtimeInput": {"video": {"data": data, "mimeType": "image/jpeg"}}}), False, SKIPPED
    if kind == "bad_audio":
        data = draw(st.sampled_from(["AAAA", "@@@", "", "AA-_AA+/"]))  # odd bytes, not base64, empty, mixed
        mime = draw(st.sampled_from(["audio/pcm;rate=16000", "audio/pcm;rate=1", "audio/opus"]))
        return json.dumps({"realtimeInput": {"audio": {"data": data, "mimeType": mime}}}), False, SKIPPED
    if kind == "over_message_limit":  # past max_message_bytes (16 MiB): the WebSocket layer closes
        return TOO_BIG, False, CLOSE_TOO_BIG
    if kind == "huge_frame":
        size = draw(st.sampled_from([11 * 1024 * 1024, 2 * 1024 * 1024]))  # over max_frame_bytes; a huge bad image
        return json.dumps({"realtimeInput": {"video": {"data": "A" * size, "mimeType": "image/jpeg"}}}), False, SKIPPED
    message = _recase({"realtime_input": {"video": {"data": base64.urlsafe_b64encode(jpeg).decode().rstrip("="),
                                                    "mime_type": "image/jpeg"}}}, draw)
    return json.dumps(message), False, SKIPPED  # mixed casing, unpadded URL-safe: just a frame


@pytest.fixture
async def bystander(live_server: RunningServer, live_tls: tuple[Path, Path]) -> AsyncIterator[Raw]:
    """A session open through the whole fuzz run; it must keep answering."""
    async with raw(live_server, live_tls[0], f"?key={API_KEY}") as conn:
        await conn.asks(60)
        yield conn


TOO_BIG = json.dumps({"realtimeInput": {"video": {"data": "A" * (17 * 1024 * 1024)}}})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=hostile())
@example(case=(TOO_BIG, False, CLOSE_TOO_BIG))
@example(case=('{"setup": {"model": "m"}}', False, CLOSE_INVALID))
async def test_hostile_input_gets_its_documented_answer(
    live_server: RunningServer, live_tls: tuple[Path, Path], bystander: Raw, case: tuple[str, bool, Any]
) -> None:
    """Each hostile message (one over max_message_bytes too) closes with its documented code
    and a reason, or is skipped and the session answers a question after it; the bystander
    session is not affected."""
    message, first, expected = case
    async with raw(live_server, live_tls[0], f"?key={API_KEY}", setup=None if first else TEXT_SETUP) as conn:
        await conn.send(message)
        if expected == SKIPPED:
            await conn.asks(3)
        else:
            code, reason = await conn.closed()
            assert code == expected and (reason or code == CLOSE_TOO_BIG), (message[:200], code, reason)
    await bystander.asks(4)


async def test_a_close_for_an_error_is_counted(live_server: RunningServer, live_tls: tuple[Path, Path]) -> None:
    """An error said by closing counts in livesight_errors_total by its code, as an error event does."""
    import httpx

    context = ssl.create_default_context(cafile=str(live_tls[0]))
    url = f"https://{live_server.host}:{live_server.port}/metrics"

    async def count() -> float:
        async with httpx.AsyncClient(verify=context, headers={"x-goog-api-key": API_KEY}) as http:
            text = (await http.get(url)).text
        counter = 'livesight_errors_total{code="unknown_type"}'
        line = next((row for row in text.splitlines() if row.startswith(counter)), "x 0")
        return float(line.split()[-1])

    before = await count()
    async with raw(live_server, live_tls[0], f"?key={API_KEY}") as conn:
        await conn.send({"toolResponse": {"functionResponses": []}})
        code, reason = await conn.closed()
    assert code == 1008 and "tool" in reason
    assert await count() == before + 1
