"""Sending the outbox's deliveries: webhooks (and MQTT, ``mqtt.py``), retried with exponential
backoff and jitter until the receiver takes them or ``max_age_s`` has passed since the event.

A webhook is a JSON POST of the event, signed as payment webhooks are: the header
``livesight-signature: t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` with the stream's
secret, and ``livesight-event-id`` (the idempotency key: a receiver that saw it already can
answer 2xx and do nothing). Any 2xx is taken; anything else, or no answer within
``timeout_s``, is tried again later. One sender per server, ``concurrency`` posts at a time;
servers sharing the outbox each claim the deliveries they try.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from server.streams.outbox import Delivery, Outbox, StreamEvent

log = logging.getLogger("livesight.streams")

SIGNATURE_HEADER = "livesight-signature"
EVENT_ID_HEADER = "livesight-event-id"
#: A delivery is claimed for its try's timeout and this long: then it is due again (its server
#: died while trying), for this server or another sharing the outbox.
CLAIM_MARGIN_S = 5.0


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``livesight-signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` within ``tolerance_s`` of ``now``
    (what a receiver runs; the docs show the same in a few lines)."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), f"t={timestamp},v1={fields.get('v1', '')}")


def payload(event: StreamEvent) -> bytes:
    """The body every channel sends for ``event``."""
    return json.dumps({"id": event.event_id, "seq": event.seq, "type": event.kind, "stream_id": event.stream_id,
                       "at_ms": event.at_ms, **event.body}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class DeliveryLimits:
    timeout_s: float = 10.0
    max_age_s: float = 24 * 3600.0
    first_retry_s: float = 1.0
    max_retry_s: float = 300.0
    concurrency: int = 8


def backoff_s(failures: int, first_s: float, cap_s: float) -> float:
    """The wait after ``failures`` failures in a row (1: the first): doubling from ``first_s``,
    capped at ``cap_s``, times a random 0.5-1.5, so what comes back (a receiver, a camera, a
    broker) is not hit by every retry at once. The streams' reconnects and the deliveries' retries."""
    return min(cap_s, first_s * 2 ** min(max(failures, 1) - 1, 30)) * random.uniform(0.5, 1.5)


def retry_after_s(attempts: int, limits: DeliveryLimits) -> float:
    """The wait before try ``attempts + 1`` of a delivery."""
    return backoff_s(attempts + 1, limits.first_retry_s, limits.max_retry_s)


Send = Callable[[Delivery], Awaitable[None]]


class Sender:
    """The server's one delivery loop over the outbox (``run`` in its task group): up to
    ``concurrency`` deliveries in flight, each on its own (a slow receiver holds only its own)."""

    def __init__(self, outbox: Outbox, limits: DeliveryLimits, mqtt: Send | None = None) -> None:
        self.outbox = outbox
        self.limits = limits
        self.mqtt = mqtt
        self.delivered = 0
        self.failed_tries = 0
        self.given_up = 0
        self._http: httpx.AsyncClient | None = None
        self._flying: set[tuple[str, str]] = set()
        self._freed = anyio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.limits.timeout_s, follow_redirects=False) as http, \
                anyio.create_task_group() as tg:
            self._http = http
            while True:
                added, freed = self.outbox.added, self._freed
                room = self.limits.concurrency - len(self._flying)
                if room > 0:
                    claim_ms = (self.limits.timeout_s + CLAIM_MARGIN_S) * 1000
                    due = await self.outbox.due(time.time() * 1000, room, claim_ms)
                    for delivery in [d for d in due if _key(d) not in self._flying]:
                        self._flying.add(_key(delivery))
                        tg.start_soon(self._deliver, delivery)
                next_ms = await self.outbox.next_due_ms()
                wait_s = 60.0 if next_ms is None else (next_ms - time.time() * 1000) / 1000
                if wait_s > 0 or room <= 0:
                    await _either(added, freed, min(max(wait_s, 0.05), 60.0))

    async def _deliver(self, delivery: Delivery) -> None:
        try:
            await self._try(delivery)
        finally:
            self._flying.discard(_key(delivery))
            self._freed.set()
            self._freed = anyio.Event()

    async def _try(self, delivery: Delivery) -> None:
        event = delivery.event
        try:
            if delivery.channel == "webhook":
                await self._post(delivery)
            elif delivery.channel == "mqtt" and self.mqtt is not None:
                await self.mqtt(delivery)
            else:
                raise RuntimeError(f"no sender for {delivery.channel}")
        except Exception as exc:  # noqa: BLE001 - a receiver's failure of any kind is retried
            self.failed_tries += 1
            now_ms = time.time() * 1000
            if now_ms - event.at_ms > self.limits.max_age_s * 1000:
                self.given_up += 1
                log.warning("stream %s: %s delivery of %s given up after %d tries: %s", event.stream_id,
                            delivery.channel, event.event_id, delivery.attempts + 1, exc)
                await self.outbox.settle(event.event_id, delivery.channel, "abandoned", now_ms, str(exc)[:500])
                return
            due_ms = now_ms + retry_after_s(delivery.attempts, self.limits) * 1000
            await self.outbox.settle(event.event_id, delivery.channel, "pending", due_ms, str(exc)[:500])
            return
        self.delivered += 1
        await self.outbox.settle(event.event_id, delivery.channel, "delivered", time.time() * 1000)

    async def _post(self, delivery: Delivery) -> None:
        assert self._http is not None
        target: dict[str, Any] = delivery.target
        body = payload(delivery.event)
        headers = {"content-type": "application/json", EVENT_ID_HEADER: delivery.event.event_id}
        if target.get("secret"):
            headers[SIGNATURE_HEADER] = signature(str(target["secret"]), int(time.time()), body)
        response = await self._http.post(str(target["url"]), content=body, headers=headers)
        if not 200 <= response.status_code < 300:
            raise RuntimeError(f"the webhook answered {response.status_code}")


def _key(delivery: Delivery) -> tuple[str, str]:
    return delivery.event.event_id, delivery.channel


async def _either(a: anyio.Event, b: anyio.Event, timeout_s: float) -> None:
    """Wait until ``a`` or ``b`` is set, at most ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        async with anyio.create_task_group() as tg:
            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, a)
            tg.start_soon(wait, b)
