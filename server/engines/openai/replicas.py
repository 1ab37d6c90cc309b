"""Which replica serves a session, and what it is believed to hold.

Several replicas may serve one model. A session always goes to the same one, chosen by
rendezvous hashing of its id, so its prefix stays warm there and only the sessions of a replica
that goes away move. Health is learnt lazily: a healthy replica is trusted until a request to
it fails, which checks it at once, so no check sits on the way to the first token; a failed
one is skipped until a check, made once its last one is stale, passes again.

A replica also remembers, for each session, the content keys of the images that session has
sent it, which lets the session's next requests name them by ``uuid`` alone. The sets are
kept per session, not per replica, because a replica URL may be a router (llm-d, vLLM's
production-stack router, HAProxy) in front of several vLLMs, pinning each session to one of
them by its session header: there a cache miss means that one session moved to another
backend (or landed on another API process of a vLLM run with ``--api-server-count`` above
one), not that the URL lost everything. A set is a belief, not a fact: a session's set is
dropped after its cache miss, and every set when the replica's health changes (it may have
restarted with an empty cache, and perhaps with other options). A session that misses three
times in a row sends its images with their data from then on (a backend that keeps no
images between requests); no other session is affected.
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
HELD_KEYS_PER_SESSION = 512  # content keys remembered per session and replica (a forgotten one is sent again)
HELD_SESSIONS = 4096  # sessions remembered per replica, least recently used dropped first
_MISSES_BEFORE_DATA_ONLY = 3  # a session's cache misses in a row after which it sends every image's data


class ReplicaDown(EngineError):
    """The replica could not be reached and its health check failed: another may serve."""


@dataclass
class HeldImages:
    """The images one session has sent one replica (and so the replica holds, unless it lost
    them or the session moved to another backend behind it)."""

    keys: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)
    misses_in_row: int = 0  # the session's requests naming images by uuid that missed, in a row

    @property
    def refer(self) -> bool:
        """False once the session missed every time in a row: where its requests land, images
        are not kept between requests (a multimodal cache off, or requests spread over API
        processes), so naming them would only double each request."""
        return self.misses_in_row < _MISSES_BEFORE_DATA_ONLY

    def holds(self, key: str) -> bool:
        """True when the image ``key`` was sent (since the set was last dropped)."""
        if key in self.keys:
            self.keys.move_to_end(key)
            return True
        return False

    def remember(self, keys: Iterable[str]) -> None:
        """Note images the replica accepted with their data."""
        for key in keys:
            self.keys[key] = None
            self.keys.move_to_end(key)
        while len(self.keys) > HELD_KEYS_PER_SESSION:
            self.keys.popitem(last=False)


@dataclass
class Replica:
    """One server (or router): its API root (``.../v1``), what its last health check said,
    and, per session, the images the session has sent it."""

    base: str
    healthy: bool = True
    checked_at: float = -math.inf
    sessions: OrderedDict[str, HeldImages] = field(default_factory=OrderedDict, repr=False)

    @property
    def api(self) -> str:
        return self.base + "/v1"

    @property
    def held_images(self) -> int:
        """Images held, counted over the sessions."""
        return sum(len(held.keys) for held in self.sessions.values())

    def held(self, session_id: str) -> HeldImages:
        """The session's set here (new and empty the first time)."""
        held = self.sessions.get(session_id)
        if held is None:
            held = self.sessions[session_id] = HeldImages()
            while len(self.sessions) > HELD_SESSIONS:
                self.sessions.popitem(last=False)
        else:
            self.sessions.move_to_end(session_id)
        return held

    def release(self, session_id: str) -> None:
        """The session ended: forget its set."""
        self.sessions.pop(session_id, None)

    def forget(self) -> None:
        """Drop every set: every image goes with its data again until the replica accepts it."""
        self.sessions.clear()


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
        replica.forget()  # down or back: it may have restarted with an empty cache (and other options)
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
