"""The server's memory, wired: the store the settings name opened for the server's life,
its writer, the sweeper that applies the age limit, and the HTTP views of a session's
moments (``GET /v1/sessions/{id}/moments`` and each keyframe)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import anyio
from fastapi.responses import JSONResponse, Response

from handlers.core.memory import moment_url
from handlers.core.negotiation import MemoryPolicy
from handlers.session.memory_jobs import Memory, MemoryWriter
from server.memory.factory import open_store
from server.memory.store import MemoryLimits, same_owner
from server.settings import Settings

log = logging.getLogger("livesight.memory")

#: How often the age limit is applied.
SWEEP_INTERVAL_S = 60.0
#: Longest wait at shutdown for queued writes.
FLUSH_TIMEOUT_S = 10.0
#: Moments one listing returns at most.
MAX_LISTED = 1000


def memory_policy(settings: Settings) -> MemoryPolicy | None:
    """What sessions need of the memory settings; None when the server keeps no memory."""
    if _off(settings):
        return None
    context = settings.memory_context_chars if _reads_context(settings) else 0
    return MemoryPolicy(
        default=settings.memory_default, keyframe_s=settings.memory_keyframe_s, min_keyframe_s=settings.memory_min_keyframe_s,
        scene_similarity=settings.memory_scene_similarity, max_search_moments=settings.memory_max_search_moments,
        caption_prompt=settings.memory_caption_prompt, caption_tokens=settings.memory_caption_tokens,
        context_chars=context,
    )


def _reads_context(settings: Settings) -> bool:
    """False for a model trained on one fixed prompt form (the demo colours models, whose card
    says so): text before its question moves it off its answers."""
    from server.models.demo import DEMO_FAMILY, declared_prompt_frames, shipped_model_dir

    model = settings.model or str(shipped_model_dir(DEMO_FAMILY))  # a remote engine's model: when it is a local path
    if declared_prompt_frames(model) is not None:
        log.info("memory: the model's prompts carry no captions of earlier moments (its card fixes its prompt)")
        return False
    return True


def _off(settings: Settings) -> bool:
    return (settings.memory_url or "").strip().lower() == "off"


@asynccontextmanager
async def open_memory(settings: Settings) -> AsyncIterator[Memory | None]:
    """The store for the server's life (None with ``memory_url=off``); queued writes are
    flushed before it closes."""
    if _off(settings):
        yield None
        return
    limits = MemoryLimits(settings.memory_max_age_s, settings.memory_max_session_bytes, settings.memory_max_bytes)
    store = open_store(settings.memory_url, settings.data_dir, limits)
    await store.open()
    writer = MemoryWriter(store, settings.memory_max_pending_writes)
    log.info("memory: %s store", store.backend)
    try:
        yield Memory(store, writer)
    finally:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FLUSH_TIMEOUT_S):
                await writer.flush()
            await store.close()


async def sweep_memory(memory: Memory, max_age_s: float) -> None:
    """Delete what is older than the age limit, every ``SWEEP_INTERVAL_S``; runs for the server."""
    while True:
        await anyio.sleep(min(SWEEP_INTERVAL_S, max_age_s / 4))
        try:
            deleted = await memory.store.sweep(time.time() * 1000)
        except (OSError, RuntimeError) as exc:
            log.warning("memory sweep failed: %s", exc)
            continue
        if deleted:
            log.info("memory sweep deleted %d records older than %.0f s", deleted, max_age_s)


def memory_summary(memory: Memory | None, captions: dict[str, float]) -> dict[str, object] | None:
    """The memory's counts for ``/metrics.json`` (None: the server keeps no memory)."""
    if memory is None:
        return None
    writer = memory.writer
    return {"backend": memory.store.backend, "written": writer.written, "pending": writer.pending,
            "dropped": writer.dropped, "failed": writer.failed, **captions}


async def _owned(memory: Memory, session_id: str, owner: str) -> bool:
    """Whether a client presenting ``owner`` (its key's digest) may see the session's memory:
    the key that opened the session (any, for memory kept before owners were recorded)."""
    kept = await memory.store.owner(session_id)
    return kept is None or same_owner(kept, owner)


async def moments_listing(memory: Memory | None, session_id: str, query: Mapping[str, str], owner: str) -> Response:
    """A session's moments (``from_ms``, ``to_ms``, ``limit`` from the query), oldest first;
    404 for a session of another key."""
    if memory is None:
        return JSONResponse({"error": "this server keeps no memory"}, status_code=404)
    try:
        start = float(query["from_ms"]) if "from_ms" in query else None
        end = float(query["to_ms"]) if "to_ms" in query else None
        limit = min(MAX_LISTED, max(1, int(query.get("limit", MAX_LISTED))))
    except ValueError:
        return JSONResponse({"error": "from_ms, to_ms and limit must be numbers"}, status_code=400)
    try:
        if not await _owned(memory, session_id, owner):
            return JSONResponse({"error": "no such session"}, status_code=404)
        moments = await memory.store.moments(session_id, start, end, limit=limit)
    except ValueError:  # not a session id the store could hold
        return JSONResponse({"error": "no such session"}, status_code=404)
    return JSONResponse({"session_id": session_id, "moments": [
        {"moment_id": m.moment_id, "start_ms": m.start_ms, "end_ms": m.end_ms, "caption": m.caption,
         "bytes": m.jpeg_bytes, "url": moment_url(session_id, m.moment_id)}
        for m in moments
    ]})


async def keyframe_response(memory: Memory | None, session_id: str, moment_id: int, owner: str) -> Response:
    """One moment's keyframe (JPEG), or 404 (also for a session of another key)."""
    try:
        owned = memory is not None and await _owned(memory, session_id, owner)
        jpeg = await memory.store.jpeg(session_id, moment_id) if memory is not None and owned else None
    except ValueError:  # not a session id the store could hold
        jpeg = None
    if jpeg is None:
        return JSONResponse({"error": "no such moment"}, status_code=404)
    return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})
