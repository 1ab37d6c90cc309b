"""Which replica serves a session, and what it is believed to hold.

Several replicas may serve one model. A session always goes to the same one, chosen by
rendezvous hashing of its id, so its prefix stays warm there and only the sessions of a replica
that goes away move. Health is learnt lazily: a healthy replica is trusted until a request to
it fails, which checks it at once, so no check sits on the way to the first token; a failed
one is skipped until a check, made once its last one is stale, passes again.

A replica also remembers the content keys of the images it has been sent (keys are content
hashes, so one set serves every session), which lets a request name them by ``uuid`` alone.
The set is a belief, not a fact: it is dropped whenever the replica's health changes (it may
have restarted with an empty cache, and perhaps with other options) and after a cache miss.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import anyio
import httpx

from server.engines.base import EngineError

log = logging.getLogger("livesight.engines")

HEALTH_TIMEOUT_S = 3.0
_HELD_KEYS = 8192  # content keys remembered per replica (a forgotten one is only sent again)
_MISSES_BEFORE_DATA_ONLY = 3  # cache misses in a row after which a replica gets every image's data


class ReplicaDown(EngineError):
    """The replica could not be reached and its health check failed: another may serve."""


@dataclass
class Replica:
    """One server: its API root (``.../v1``), what its last health check said, and the
    content keys of the images it has been sent (and so holds, unless it lost them)."""

    base: str
    healthy: bool = True
    checked_at: float = -math.inf
    held: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)
    misses_in_row: int = 0  # requests naming images by uuid that it could not serve, in a row

    @property
    def api(self) -> str:
        return self.base + "/v1"

    @property
    def keeps_images(self) -> bool:
        """False once it missed every time in a row: it keeps no images between requests (a
        server with its multimodal cache off), so naming them would only double each request."""
        return self.misses_in_row < _MISSES_BEFORE_DATA_ONLY

    def holds(self, key: str) -> bool:
        """True when the image ``key`` was sent here (since the set was last dropped)."""
        if key in self.held:
            self.held.move_to_end(key)
            return True
        return False

    def remember(self, keys: Iterable[str]) -> None:
        """Note images the replica accepted with their data."""
        for key in keys:
            self.held[key] = None
            self.held.move_to_end(key)
        while len(self.held) > _HELD_KEYS:
            self.held.popitem(last=False)

    def forget(self) -> None:
        """Drop the set: every image goes with its data again until the replica accepts it."""
        self.held.clear()


def replica_base(url: str) -> str:
    """The server root of ``url`` (``http://host:8000`` from ``http://host:8000/v1/``)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def rendezvous_order(session_id: str, replicas: Iterable[Replica]) -> list[Replica]:
    """Replicas from most to least preferred for ``session_id`` (highest random weight first)."""

    def weight(replica: Replica) -> bytes:
        return hashlib.blake2b(f"{session_id}|{replica.base}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


async def pick(
    client: httpx.AsyncClient, replicas: list[Replica], session_id: str, health_interval_s: float
) -> Replica:
    """The session's replica: the most preferred one that is healthy.

    Raises ``EngineError`` when none is.
    """
    for replica in rendezvous_order(session_id, replicas):
        # A healthy replica is trusted until a request to it fails, which checks it at once
        # (no check on the way to the first token); a failed one is checked again once its
        # last check is stale.
        if not replica.healthy and time.monotonic() - replica.checked_at > health_interval_s:
            await check(client, replica)
        if replica.healthy:
            return replica
    raise EngineError("no healthy server: " + ", ".join(r.base for r in replicas))


async def check_all(client: httpx.AsyncClient, replicas: list[Replica]) -> None:
    """Check every replica at once, giving up on the slow ones after two check timeouts."""
    with anyio.move_on_after(2 * HEALTH_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            for replica in replicas:
                tg.start_soon(check, client, replica)


async def check(client: httpx.AsyncClient, replica: Replica) -> None:
    """Health check: ``/health`` (vLLM, SGLang), else ``/v1/models`` (any OpenAI server)."""
    healthy = False
    try:
        with anyio.fail_after(HEALTH_TIMEOUT_S):
            response = await client.get(replica.base + "/health")
            if response.status_code in (404, 405):
                response = await client.get(replica.api + "/models")
            healthy = response.status_code == 200
    except (httpx.HTTPError, TimeoutError) as exc:
        log.debug("health check of %s failed: %s", replica.base, exc)
    if healthy != replica.healthy:
        log.warning("replica %s is %s", replica.base, "back" if healthy else "down")
        replica.forget()  # down or back: it may have restarted with an empty cache
        replica.misses_in_row = 0  # ... and perhaps with other options
    replica.healthy = healthy
    replica.checked_at = time.monotonic()


async def failure(client: httpx.AsyncClient, replica: Replica, exc: httpx.HTTPError) -> EngineError:
    """The error for a transport failure; returns ``ReplicaDown`` when the replica, checked
    now (so a dead one is skipped from here on), is down, else a plain ``EngineError``."""
    await check(client, replica)
    if not replica.healthy:
        return ReplicaDown(f"{replica.base}: {type(exc).__name__}: {exc}")
    return EngineError(f"{replica.base}: {type(exc).__name__}: {exc}")


async def discover_model(client: httpx.AsyncClient, replicas: list[Replica]) -> str:
    """The model the first healthy replica that can say serves.

    Raises ``EngineError`` when none can.
    """
    for replica in replicas:
        if not replica.healthy:
            continue
        try:
            response = await client.get(replica.api + "/models")
            models = response.json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        if models and isinstance(models[0], dict) and models[0].get("id"):
            return str(models[0]["id"])
    raise EngineError("no server could name its model; set model (LIVESIGHT_MODEL) to the served model name")
