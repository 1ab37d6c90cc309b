"""Test doubles for the timing-sensitive tier: a scripted engine and an in-memory transport.

Never used by the shipped server: the real app is tested with the real engine elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from handlers.session.transport import Disconnected
from server.client.connection import collect_until
from server.engines.base import (
    Capabilities,
    CheckResult,
    Engine,
    EngineError,
    EngineEvent,
    Finished,
    ImageSegment,
    Prompt,
    Sampling,
    TextDelta,
    TextSegment,
    Usage,
)
from tests.protocol_client import Client


def image_keys(prompt: Prompt) -> list[str]:
    return [s.key for t in prompt.turns for s in t.segments if isinstance(s, ImageSegment)]


@dataclass
class ScriptedEngine(Engine):
    """Emits ``words`` one per ``step_s``; records prefills, requests and aborts. With
    ``read_images``, it reads every image of the prompt before each word, as an engine
    computing over them would, and fails the answer when one can no longer be read."""

    words: list[str] = field(default_factory=lambda: ["a ", "b ", "c"])
    step_s: float = 0.0
    prefill_s: float = 0.0
    fail_next: bool = False
    warm: bool = True
    read_images: bool = False
    prefills: list[Prompt] = field(default_factory=list)
    prefills_done: int = 0
    prefills_cancelled: int = 0
    requests: list[Prompt] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    #: ``check``: the probability of yes for a prompt, by its newest image's key and its question
    #: (None: the engine gives no token probabilities).
    yes: Any = None
    check_s: float = 0.0
    checks: list[Prompt] = field(default_factory=list)
    checks_cancelled: int = 0

    def __post_init__(self) -> None:
        self.capabilities = Capabilities(
            name="scripted", model="scripted", warm_prefix=self.warm, token_probabilities=self.yes is not None
        )

    async def check(self, session_id: str, request_id: str, prompts: list[Prompt]) -> list[CheckResult]:
        if self.yes is None:
            return await super().check(session_id, request_id, prompts)
        self.checks.extend(prompts)
        try:
            await anyio.sleep(self.check_s)
        except anyio.get_cancelled_exc_class():
            self.checks_cancelled += 1
            raise
        out = []
        for prompt in prompts:
            question = next(s.text for s in reversed(prompt.turns[-1].segments) if isinstance(s, TextSegment))
            out.append(CheckResult(float(self.yes(image_keys(prompt)[-1], question))))
        return out

    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        self.prefills.append(prompt)
        try:
            await anyio.sleep(self.prefill_s)
        except anyio.get_cancelled_exc_class():
            self.prefills_cancelled += 1
            raise
        self.prefills_done += 1
        return len(image_keys(prompt))

    async def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        self.requests.append(prompt)
        if self.fail_next:
            self.fail_next = False
            raise EngineError("scripted failure")
        self.running.add(request_id)
        finished = False
        try:
            for word in self.words[: sampling.max_tokens]:
                await anyio.sleep(self.step_s)
                if self.read_images:
                    self._read_images(prompt)
                yield TextDelta(word)
            finished = True
            yield Finished("stop", Usage(10, 0, len(self.words)))
        finally:
            self.running.discard(request_id)
            if not finished:
                self.aborted.append(request_id)


    @staticmethod
    def _read_images(prompt: Prompt) -> None:
        for turn in prompt.turns:
            for segment in turn.segments:
                if isinstance(segment, ImageSegment):
                    try:
                        segment.pixels()
                    except ValueError as exc:
                        raise EngineError(f"image {segment.key} can no longer be read") from exc


class _TestEnd:
    """The test's end of a ``MemoryTransport``, shaped as the socket a ``Connection`` reads."""

    def __init__(self, to_server: Any, from_server: Any) -> None:
        self._to_server, self._from_server = to_server, from_server

    async def send(self, raw: str | bytes) -> None:
        await self._to_server.send(raw)

    async def recv(self) -> str:
        return await self._from_server.receive()

    async def close(self) -> None:
        self._to_server.close()


class MemoryTransport:
    """A transport whose other end is the test (through the suite's protocol ``Client``)."""

    def __init__(self) -> None:
        self._to_server, self._server_in = anyio.create_memory_object_stream[str | bytes](100)
        self._server_out, self._from_server = anyio.create_memory_object_stream[str](1000)
        self.closed_with: int | None = None
        self.client = Client(_TestEnd(self._to_server, self._from_server))

    async def receive(self) -> str | bytes:
        try:
            return await self._server_in.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise Disconnected from None

    async def send(self, text: str) -> None:
        if self.closed_with is not None:
            raise Disconnected
        await self._server_out.send(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed_with is None:
            self.closed_with = code
            self._server_out.close()

    # the test's side; ``timeout`` is for each event
    async def put(self, **message: Any) -> None:
        await self.client.send(**message)

    async def get(self, timeout: float = 5) -> dict[str, Any]:
        return await self.client.recv(timeout)

    async def get_type(self, kind: str, timeout: float = 5) -> dict[str, Any]:
        return (await self.until(kind, timeout))[-1]

    async def until(self, kind: str, timeout: float = 5) -> list[dict[str, Any]]:
        return await collect_until(lambda _: self.get(timeout), lambda event: event["type"] == kind, math.inf)

    async def drain(self) -> list[dict[str, Any]]:
        """Every event the server has sent and the test not yet read (without waiting)."""
        out = []
        while True:
            try:
                out.append(await self.get(timeout=0.001))
            except TimeoutError:
                return out

    def hang_up(self) -> None:
        self._to_server.close()


async def run_session(
    engine: Engine, limits: Any, body: Any, observer: Any = None, **config: Any
) -> tuple[Any, MemoryTransport]:
    """Run one session of the adapter over a ``MemoryTransport`` with ``config`` (and
    ``observer``): once it is ready, ``await body(transport, session)``, then hang up. Returns
    the session and transport."""
    from handlers.session.adapter import Session

    transport = MemoryTransport()
    session = Session(transport, engine, limits, config_timeout_s=5, observer=observer)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.run)
        await transport.put(type="session.config", **config)
        assert (await transport.get())["type"] == "session.ready"
        await body(transport, session)
        transport.hang_up()
    return session, transport
