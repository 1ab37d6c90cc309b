"""Ephemeral client keys, as OpenAI's ``POST /v1/realtime/client_secrets`` mints them.

A server-side app holding a real API key asks for one (``mint``) and hands the ``ek_`` value
to a browser, which may then open a session (a WebRTC call, the Realtime or v1 WebSocket)
with it until it expires. A key may carry a Realtime session config: it is applied when the
session starts and wins over what the client asks later. Keys live in this process only, at
most ``max_keys`` at a time (past it the one closest to expiry goes), and are never logged.
"""

from __future__ import annotations

import heapq
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

PREFIX = "ek_"
MIN_TTL_S = 10
MAX_TTL_S = 7200
DEFAULT_TTL_S = 600


@dataclass(frozen=True, slots=True)
class ClientSecret:
    """One minted key: when it expires (unix seconds), the Realtime session bound to it
    (``{}``: none) and the digest of the API key that minted it (its sessions' owner)."""

    value: str = field(repr=False)
    expires_at: int
    session: dict[str, Any]
    owner: str


class ClientSecretError(ValueError):
    """A mint request that is not valid (said to the caller as a 400)."""


class ClientSecrets:
    """The keys minted by this server that have not expired."""

    def __init__(self, max_keys: int, clock: Any = time.time) -> None:
        self.max_keys = max_keys
        self._clock = clock
        self._keys: dict[str, ClientSecret] = {}
        self._expiry: list[tuple[int, str]] = []  # (expires_at, value): a heap, stale entries skipped

    def __len__(self) -> int:
        return len(self._keys)

    def mint(self, body: dict[str, Any], owner: str) -> ClientSecret:
        """A new key from a request body (``expires_after: {"anchor": "created_at", "seconds":
        N}``, ``session``). Raises ``ClientSecretError``."""
        ttl = _ttl(body.get("expires_after"))
        session = body.get("session") or {}
        if not isinstance(session, dict):
            raise ClientSecretError("session must be an object (a Realtime session config)")
        if self.max_keys < 1:
            raise ClientSecretError("this server mints no ephemeral keys")
        self._sweep()
        while len(self._keys) >= self.max_keys:
            self._drop_soonest()
        secret = ClientSecret(PREFIX + secrets.token_urlsafe(32), int(self._clock()) + ttl, session, owner)
        self._keys[secret.value] = secret
        heapq.heappush(self._expiry, (secret.expires_at, secret.value))
        return secret

    def find(self, presented: str | None) -> ClientSecret | None:
        """The live key ``presented`` names (compared in constant time), else None."""
        if not presented or not presented.startswith(PREFIX):
            return None
        self._sweep()
        found = self._keys.get(presented)
        if found is None or not hmac.compare_digest(found.value.encode(), presented.encode()):
            return None
        return found

    def _sweep(self) -> None:
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, value = heapq.heappop(self._expiry)
            self._keys.pop(value, None)

    def _drop_soonest(self) -> None:
        while self._expiry:
            _, value = heapq.heappop(self._expiry)
            if self._keys.pop(value, None) is not None:
                return


def _ttl(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise ClientSecretError("expires_after must be an object: {\"anchor\": \"created_at\", \"seconds\": N}")
    anchor = expires_after.get("anchor", "created_at")
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if anchor != "created_at":
        raise ClientSecretError("expires_after.anchor must be \"created_at\"")
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise ClientSecretError(f"expires_after.seconds must be an integer from {MIN_TTL_S} to {MAX_TTL_S}")
    return seconds
