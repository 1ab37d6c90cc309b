"""The session's memory jobs: what the core says to keep goes to the server's one
``MemoryWriter`` (in order, off the loop, bounded: past ``max_pending`` a record is dropped
and counted, the session never waits for the disk); what it asks to read is read from the
store and handed back as a job's result (``Executor`` inherits ``MemoryJobs``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import anyio
from anyio.abc import TaskGroup

from handlers.core.effects import (
    Caption,
    Captioned,
    FindMemory,
    ForgetMemory,
    KeepCaption,
    KeepMoment,
    KeepNote,
    LoadMoments,
    MemoryForgotten,
    MemoryFound,
    MomentsLoaded,
    Recall,
    Recalled,
    RecalledMoment,
    Result,
    TextFound,
)

from handlers.core.jobs import CaptionStep
from handlers.core.machine import SessionMachine
from handlers.media.keyframe import jpeg_size, keyframe_jpeg
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.session.observer import SessionObserver
from server import blocking
from server.engines.base import CAPTION_REQUEST_PREFIX, Engine, EngineError, Finished, Sampling, TextDelta
from server.memory.store import MemoryStore, Moment

log = logging.getLogger("livesight.memory")


@dataclass(frozen=True, slots=True)
class _Record:
    session_id: str
    effect: KeepMoment | KeepNote | KeepCaption


class MemoryWriter:
    """The server's writes to its memory store, one at a time in the order they were asked
    (a moment's end is the next one's start), from a queue of at most ``max_pending``
    records; run ``run`` for the server's life."""

    def __init__(self, store: MemoryStore, max_pending: int) -> None:
        self.store = store
        self._send, self._receive = anyio.create_memory_object_stream[_Record](max_pending)
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self._idle = anyio.Event()
        self._idle.set()

    def put(self, session_id: str, effect: KeepMoment | KeepNote | KeepCaption) -> bool:
        """Queue a record; False (counted in ``dropped``) when the queue is full."""
        try:
            self._send.send_nowait(_Record(session_id, effect))
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):  # full, or shut down
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning("memory writes are behind: %d records dropped so far", self.dropped)
            return False
        if self._idle.is_set():
            self._idle = anyio.Event()
        return True

    @property
    def pending(self) -> int:
        return self._send.statistics().current_buffer_used

    async def run(self) -> None:
        async with self._receive:
            while True:
                if not self.pending:
                    self._idle.set()
                record = await self._receive.receive()
                try:
                    await self._write(record)
                    self.written += 1
                except Exception as exc:  # noqa: BLE001 - a bad frame or a store failure: counted, never fatal
                    self.failed += 1
                    log.warning("memory write failed for session %s: %r", record.session_id[:8], exc)

    async def flush(self) -> None:
        """Wait until every queued record is written (or failed)."""
        while not (self._idle.is_set() and not self.pending):
            await self._idle.wait()

    async def _write(self, record: _Record) -> None:
        effect = record.effect
        if isinstance(effect, KeepMoment):
            jpeg, _size = await blocking.run_blocking(keyframe_jpeg, effect.data, effect.side)
            await self.store.add_moment(record.session_id, effect.at_ms, jpeg)
        elif isinstance(effect, KeepCaption):
            found = await self.store.moments(record.session_id, effect.at_ms, effect.at_ms, limit=4)
            moment = next((m for m in found if m.start_ms == effect.at_ms), None)
            if moment is not None:  # else it is gone already (cleared, or past a limit)
                await self.store.set_caption(record.session_id, moment.moment_id, effect.text)
        else:
            await self.store.add_note(record.session_id, effect.kind, effect.at_ms, effect.text)


@dataclass(frozen=True, slots=True)
class Memory:
    """What a session's memory jobs use: the server's store and its writer."""

    store: MemoryStore
    writer: MemoryWriter


def _recalled(moment: Moment, jpeg: bytes = b"") -> RecalledMoment:
    size = jpeg_size(jpeg) if jpeg else (0, 0)
    return RecalledMoment(moment.moment_id, moment.start_ms, moment.end_ms, jpeg, size, moment.caption)


class MemoryJobs:
    """The executor's memory half (its state: ``memory``, ``core``, ``_tg``; ``result`` hands
    the core a job's result)."""

    memory: Memory | None
    core: SessionMachine
    engine: Engine
    _tg: TaskGroup
    _scopes: dict[int, anyio.CancelScope]
    observer: SessionObserver
    result: Callable[[Result, Origin | None], Awaitable[None]]

    def _store(self) -> MemoryStore:
        if self.memory is None:
            raise SessionError(ErrorCode.MEMORY_OFF, "this server keeps no memory")
        return self.memory.store

    @staticmethod
    @contextmanager
    def _store_errors(what: str) -> Iterator[None]:
        """A failure of the store, said as an ``internal_error`` (logged): the session goes on."""
        try:
            yield
        except SessionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any store or driver error
            log.warning("memory store failed to %s: %r", what, exc)
            raise SessionError(ErrorCode.INTERNAL_ERROR, f"the memory store failed to {what}") from None

    async def _keep(self, effect: KeepMoment | KeepNote | KeepCaption, origin: Origin | None) -> None:
        if self.memory is not None:
            self.memory.writer.put(self.core.memory_id, effect)

    async def _caption(self, effect: Caption, origin: Origin | None) -> None:
        scope = self._scopes[id(effect.step)] = anyio.CancelScope()  # a Stop may come before it runs
        self._tg.start_soon(self._write_caption, effect.step, scope)

    async def _write_caption(self, step: CaptionStep, scope: anyio.CancelScope) -> None:
        """A moment's caption, generated as a child of the session; a question stops it."""
        session = self.core.session_id
        words: list[str] = []
        text: str | None = None
        began = time.perf_counter()
        try:
            with scope:
                stream = self.engine.generate(session, f"{CAPTION_REQUEST_PREFIX}{session[:8]}", step.prompt,
                                              Sampling(0.0, 1.0, step.tokens, 0))
                try:
                    async for event in stream:
                        if isinstance(event, TextDelta):
                            words.append(event.text)
                        elif isinstance(event, Finished):
                            usage = event.usage
                            self.observer.caption_work(usage.prompt_tokens - usage.cached_tokens,
                                                       usage.completion_tokens, time.perf_counter() - began)
                finally:
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()
                text = "".join(words)
        except EngineError as exc:
            log.warning("caption failed: %s", exc)
        finally:
            del self._scopes[id(step)]
            with anyio.CancelScope(shield=True):
                await self.result(Captioned(step, text), None)

    async def _recall(self, effect: Recall, origin: Origin | None) -> None:
        """A question's range read back, in its lane."""
        with self._store_errors("read the range"):
            found = await self._store().spread(self.core.memory_id, effect.from_ms, effect.to_ms, effect.n)
            moments = await blocking.run_blocking(lambda: [_recalled(m, jpeg) for m, jpeg in found])
        await self.result(Recalled(effect.event, effect.received, moments, effect.question), origin)

    async def _find_memory(self, effect: FindMemory, origin: Origin | None) -> None:
        """A search's range listed and its text searched, in its lane."""
        store, session, run = self._store(), self.core.memory_id, effect.run
        listed: list[RecalledMoment] = []
        text: list[TextFound] = []
        try:
            with self._store_errors("search"):
                if run.event.condition:
                    moments = await store.moments(session, run.from_ms, run.to_ms, limit=effect.limit)
                    listed = [_recalled(m) for m in moments]
                if run.event.text:
                    hits = await store.search_text(session, run.event.text, run.from_ms, run.to_ms, limit=effect.limit)
                    text = [TextFound(h.at_ms, h.kind, h.text, None if h.moment is None else _recalled(h.moment))
                            for h in hits]
        except SessionError:
            await self.result(MemoryFound(run, [], []), origin)  # the search ends (empty): another may start
            raise
        await self.result(MemoryFound(run, listed, text), origin)

    async def _load_moments(self, effect: LoadMoments, origin: Origin | None) -> None:
        self._tg.start_soon(self._load, effect, origin)

    async def _load(self, effect: LoadMoments, origin: Origin | None) -> None:
        """A search's next keyframes, beside the session's other work."""
        store, session = self._store(), self.core.memory_id
        moments: list[RecalledMoment] = []
        try:
            found = [(m, await store.jpeg(session, m.moment_id)) for m in effect.moments]
            moments = await blocking.run_blocking(  # a moment gone from the store meanwhile is left out
                lambda: [replace(m, jpeg=jpeg, size=jpeg_size(jpeg)) for m, jpeg in found if jpeg is not None])
        except Exception as exc:  # noqa: BLE001 - the store failed: this batch is skipped, the session goes on
            log.warning("memory search could not load keyframes: %r", exc)
        finally:
            with anyio.CancelScope(shield=True):
                await self.result(MomentsLoaded(effect.run, moments), origin)

    async def _forget_memory(self, effect: ForgetMemory, origin: Origin | None) -> None:
        """Everything the session remembers deleted, in its lane (queued writes first)."""
        assert self.memory is not None
        await self.memory.writer.flush()
        with self._store_errors("clear the session's memory"):
            deleted = await self._store().clear(self.core.memory_id)
        await self.result(MemoryForgotten(deleted), origin)

