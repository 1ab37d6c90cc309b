"""The server's PostgreSQL databases (the memory store, the streams' outbox): opened the same way.

A connection pool of at most ``max_connections``, whose schema is made sure of in one
transaction under an advisory lock (servers starting together on one database take turns),
closed again when that fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg


async def open_pool(url: str, max_connections: int, lock_key: int,
                    create: Callable[[asyncpg.Connection], Awaitable[object]]) -> asyncpg.Pool:
    """A pool on ``url`` after ``create`` ran on one of its connections, holding ``lock_key``."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=max_connections)
    try:
        async with pool.acquire() as db, db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock($1)", lock_key)
            await create(db)
    except BaseException:
        await pool.close()
        raise
    return pool
