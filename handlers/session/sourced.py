"""A session with no socket: the same core and executor as a client's, fed by a source.

A ``SourcedSession`` takes its client events from an async iterable (frames, questions,
watches, ``video.done``: what a camera the server pulls, or a program, would send) and hands
every event the session makes to ``deliver``. Frames are never held behind an answer; any
other event waits, in order, while the core holds lane inputs behind the running answer's
end. The session ends at the source's ``video.done`` (after its last answer), or when the
source runs dry and nothing runs any more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable

import anyio

from handlers.core.effects import Handle, Opened, Read
from handlers.core.events import Event
from handlers.core.machine import CONTROL, SessionMachine, Source
from handlers.core.negotiation import Limits
from handlers.session.executor import Executor
from handlers.session.intake import IntakeLimits
from handlers.session.observer import SessionObserver
from handlers.session.voice import voice_paths
from handlers.wire.codec import CoreInput
from handlers.wire.errors import SessionError
from handlers.wire.protocol import AudioChunkIn, SessionConfig, VideoDone, VideoFrame, origin_of
from server.engines.base import Engine
from server.speech.base import Voice

class SourcedSession:
    """One session driven by a source instead of a connection (see the module docstring)."""

    def __init__(
        self, engine: Engine, limits: Limits, config: SessionConfig, deliver: Callable[[Event], Awaitable[None]],
        *, voice: Voice | None = None, intake: IntakeLimits | None = None, observer: SessionObserver | None = None,
        session_id: str | None = None,
    ) -> None:
        self.id = session_id or uuid.uuid4().hex
        self.engine, self.voice, self.deliver = engine, voice or Voice(), deliver
        self.config = config
        self.intake = intake
        self.observer = observer or SessionObserver()
        self.core = SessionMachine(
            self.id, limits, engine.capabilities, voice_paths(engine.capabilities, self.voice),
            Source(native_trim_ms=self.voice.native_trim_ms),
        )
        self._changed = anyio.Event()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def run(self, source: AsyncIterable[CoreInput]) -> None:
        """Configure the session (``session.ready`` is delivered first), feed it the source,
        and end it. Raises ``SessionError`` when the config is refused (its error is delivered)."""
        try:
            ready = self.core.configure(self.config)
        except SessionError:
            self.core.close()
            raise
        await self.deliver(ready)
        try:
            async with anyio.create_task_group() as tg:
                executor = Executor(self.core, self.engine, self.voice, tg, send=self.deliver,
                                    end=tg.cancel_scope.cancel, wake=self._wake, observer=self.observer,
                                    intake=self.intake)
                await executor.input(Opened())
                tg.start_soon(executor.timers)
                await self._feed(executor, source)
                while not self.core.settled:  # the source ran dry: let what runs finish
                    await self._changed.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                self.core.close()
                await self.engine.release(self.id)

    async def _feed(self, executor: Executor, source: AsyncIterable[CoreInput]) -> None:
        async for event in source:
            if not isinstance(event, (VideoFrame, AudioChunkIn)):
                await executor.input(Read(event))
            if isinstance(event, CONTROL):
                continue
            if not isinstance(event, VideoFrame):
                while not self.core.takes_lane_input:
                    await self._changed.wait()
            await executor.input(Handle(event, time.monotonic()), origin_of(event))
            if isinstance(event, VideoDone):
                await anyio.sleep_forever()  # the core ends the session after its last answer
