"""Driving the Gemini Live endpoint with the real google-genai SDK: a client for the test
server, and a session wrapper that checks every raw server message against the SDK's own
``LiveServerMessage`` (unknown fields refused) before the SDK reads it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from google import genai
from google.genai import types

from server.background import ServerAddress
from tests.socket.live.conftest import API_KEY


def live_client(server: ServerAddress, api_version: str = "v1beta", api_key: str = API_KEY) -> genai.Client:
    """A google-genai client whose Live connections go to ``server`` (over TLS)."""
    return genai.Client(
        api_key=api_key, http_options={"base_url": f"https://{server.host}:{server.port}", "api_version": api_version}
    )


class Checked:
    """An SDK ``AsyncSession`` whose raw incoming messages are kept and checked strictly."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.raw: list[dict[str, Any]] = []
        ws = session._ws
        receive = ws.recv

        async def recv(*args: Any, **kwargs: Any) -> Any:
            data = await receive(*args, **kwargs)
            message = json.loads(data)
            types.LiveServerMessage.model_validate(message)  # extra="forbid": every field is one the SDK knows
            self.raw.append(message)
            return data

        ws.recv = recv

    async def turn(self, timeout: float = 120) -> list[types.LiveServerMessage]:
        """The SDK's ``receive()``: every message up to the end of the turn (``turnComplete``)."""
        out = []
        with anyio.fail_after(timeout):
            async for message in self.session.receive():
                out.append(message)
        return out

    async def until(self, done: Any, timeout: float = 120) -> list[types.LiveServerMessage]:
        """Messages (read one by one, across turns) up to the first for which ``done(m)``."""
        out = []
        with anyio.fail_after(timeout):
            while True:
                message = await self.session._receive()
                out.append(message)
                if done(message):
                    return out

    def drop(self) -> None:
        """Cut the connection with no close frame (a network failure)."""
        self.session._ws.transport.abort()


@asynccontextmanager
async def live_session(
    server: ServerAddress, config: dict[str, Any] | types.LiveConnectConfig, **client: Any
) -> AsyncIterator[Checked]:
    """``client.aio.live.connect`` to ``server``; yields the checked session."""
    async with live_client(server, **client).aio.live.connect(model="livesight", config=config) as session:
        yield Checked(session)


def text_of(messages: list[types.LiveServerMessage]) -> str:
    """The text of the model turn parts in ``messages``."""
    return "".join(
        part.text or ""
        for m in messages
        if m.server_content and m.server_content.model_turn
        for part in m.server_content.model_turn.parts or []
    )


def usage_of(messages: list[types.LiveServerMessage]) -> types.UsageMetadata:
    """The last ``usageMetadata`` in ``messages``."""
    return [m.usage_metadata for m in messages if m.usage_metadata][-1]
