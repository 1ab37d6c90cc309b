"""Who may open a session: API keys and allowed browser origins.

Both are off by default. With ``api_keys`` set, a client presents one of them as
``Authorization: Bearer KEY``, ``X-API-Key: KEY``, a WebSocket subprotocol
``livesight.api-key.KEY`` (browsers cannot set headers on a WebSocket; offer it beside
``livesight.v1``, which the server then selects) or ``?api_key=KEY`` (simplest for a browser
page, but the key lands in access logs). Gemini Live clients send theirs as
``x-goog-api-key: KEY`` (ephemeral tokens: ``Authorization: Token KEY``), ``?key=KEY`` or
``?access_token=KEY``. Keys are compared in constant time. With
``allowed_origins`` set, a browser whose ``Origin`` is not listed is refused; clients that
send no ``Origin`` (anything but a browser) are not affected, which is what the header is for.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from handlers.session.resume import digest
from handlers.wire.errors import ErrorCode
from server.client_secrets import PREFIX as EPHEMERAL_PREFIX
from server.client_secrets import ClientSecret, ClientSecrets

log = logging.getLogger("livesight.server")

SUBPROTOCOL = "livesight.v1"
KEY_SUBPROTOCOL_PREFIX = "livesight.api-key."
#: How browser clients of the OpenAI Realtime API offer their key (beside ``realtime``).
REALTIME_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of a connection check: a refusal code (None: allowed) and the subprotocol to accept."""

    refusal: ErrorCode | None
    message: str = ""
    subprotocol: str | None = None


class AccessPolicy:
    """Decides whether a connection may open a session."""

    def __init__(self, api_keys: Sequence[str] = (), allowed_origins: Sequence[str] = (),
                 client_secrets: ClientSecrets | None = None) -> None:
        self._keys = [k.encode("utf-8") for k in api_keys if k]
        origins = {_origin(o) for o in allowed_origins if o.strip()}
        self._any_origin = "*" in origins
        self._origins = origins - {"*"}
        self.client_secrets = client_secrets if client_secrets is not None else ClientSecrets(0)

    @property
    def requires_key(self) -> bool:
        return bool(self._keys)

    def check(self, headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str]) -> Verdict:
        """Check a WebSocket handshake (header names in lower case, as ASGI gives them)."""
        subprotocol = _choose_subprotocol(subprotocols)
        origin = headers.get("origin")
        if origin is not None and not same_origin(origin, headers) and not self.origin_allowed(origin):
            return Verdict(ErrorCode.FORBIDDEN_ORIGIN, "this origin may not connect", subprotocol)
        presented = _presented_key(headers, query, subprotocols)
        if self._keys and not self.key_matches(presented):
            return Verdict(ErrorCode.UNAUTHORIZED, "a valid API key is required", subprotocol)
        if presented is not None and presented.startswith(EPHEMERAL_PREFIX) and self.client_secrets.find(presented) is None:
            return Verdict(ErrorCode.UNAUTHORIZED, "the ephemeral key is unknown or has expired", subprotocol)
        return Verdict(None, "", subprotocol)

    def origin_allowed(self, origin: str) -> bool:
        """True for a browser origin that may connect (any, with ``allowed_origins`` empty)."""
        return not self._origins or self._any_origin or _origin(origin) in self._origins

    def origin_listed(self, origin: str) -> bool:
        """True for an origin ``allowed_origins`` names (or admits with ``*``): a page served
        from another origin may call the HTTP API only then (CORS)."""
        return self._any_origin or _origin(origin) in self._origins

    def secret(self, headers: Mapping[str, str], query: Mapping[str, str],
               subprotocols: Sequence[str] = ()) -> ClientSecret | None:
        """The live ephemeral key a connection presents, else None."""
        return self.client_secrets.find(_presented_key(headers, query, subprotocols))

    def owner(self, headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str] = ()) -> str:
        """Who a connection's sessions belong to: the digest of its API key (of the key that
        minted its ephemeral key; "" with none)."""
        presented = _presented_key(headers, query, subprotocols)
        secret = self.client_secrets.find(presented)
        return secret.owner if secret is not None else digest(presented)

    def key_matches(self, presented: str | None) -> bool:
        """True when ``presented`` is one of the keys (every key is compared, in constant
        time) or a live ephemeral key."""
        if presented is None:
            return False
        if presented.startswith(EPHEMERAL_PREFIX):
            return self.client_secrets.find(presented) is not None
        candidate = presented.encode("utf-8")
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        return matched

    def http_key(self, headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        """True when an HTTP request may see protected endpoints (always, with no keys set,
        unless it presents an ephemeral key that is not live)."""
        presented = _presented_key(headers, query, ())
        if presented is not None and presented.startswith(EPHEMERAL_PREFIX):
            return self.client_secrets.find(presented) is not None
        return not self._keys or self.key_matches(presented)

    def real_key(self, headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
        """True when an HTTP request presents an API key itself, not an ephemeral one
        (always, with no keys set): what minting a key takes."""
        presented = _presented_key(headers, query, ())
        if not self._keys:
            return True
        return presented is not None and not presented.startswith(EPHEMERAL_PREFIX) and self.key_matches(presented)


def warn_if_open(host: str, policy: AccessPolicy) -> bool:
    """Log a warning when the server listens beyond this machine with no API key; returns True if it did."""
    if policy.requires_key or _is_loopback(host):
        return False
    log.warning(
        "listening on %s with no API key: anyone who can reach this address can use the model. "
        "Set api_keys (LIVESIGHT_API_KEYS) for a public deployment.",
        host,
    )
    return True


def client_key(headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str]) -> str | None:
    """The API key a connection presents (any of the accepted ways), or None."""
    return _presented_key(headers, query, subprotocols)


def _presented_key(headers: Mapping[str, str], query: Mapping[str, str], subprotocols: Sequence[str]) -> str | None:
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() in {"bearer", "token"} and token.strip():
        return token.strip()
    for name in ("x-api-key", "x-goog-api-key"):
        if headers.get(name):
            return headers[name].strip()
    for proto in subprotocols:
        for prefix in (KEY_SUBPROTOCOL_PREFIX, REALTIME_KEY_SUBPROTOCOL_PREFIX):
            if proto.startswith(prefix):
                return proto[len(prefix) :]
    return query.get("api_key") or query.get("key") or query.get("access_token") or None


def _choose_subprotocol(offered: Sequence[str]) -> str | None:
    """The subprotocol to accept: a browser that offered any must get one of them back."""
    if SUBPROTOCOL in offered:
        return SUBPROTOCOL
    return offered[0] if offered else None


def same_origin(origin: str, headers: Mapping[str, str]) -> bool:
    """True when a browser's ``origin`` is the server itself (its page at ``/``): the request's
    Host. Such a page may always connect, whatever ``allowed_origins`` lists."""
    host = headers.get("host", "")
    return bool(host) and origin.split("://", 1)[-1].rstrip("/").lower() == host.lower()


def _origin(value: str) -> str:
    return value.strip().rstrip("/").lower()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere
