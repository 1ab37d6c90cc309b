"""Alerts over MQTT: one connection to the broker ``mqtt_url`` names, kept up (reconnected with
backoff), through which the outbox's MQTT deliveries are published, and Home Assistant MQTT
discovery, so each watch of a stream appears as a binary sensor.

Topics, for a stream delivering to ``TOPIC`` (its ``deliver.mqtt.topic``):

- ``TOPIC/WATCH/fired``, ``TOPIC/WATCH/cleared``, ``TOPIC/WATCH/narration``: the events (the
  same JSON as the webhooks'), QoS 1;
- ``TOPIC/WATCH/state``: ``ON`` when the watch fires, ``OFF`` when it clears (retained);
- ``DISCOVERY/binary_sensor/livesight_STREAM_WATCH/config`` (retained): the sensor, its state
  and attributes topics, and the stream as its device.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomqtt
import anyio

from server.streams.delivery import backoff_s, payload
from server.streams.outbox import Delivery

log = logging.getLogger("livesight.streams")

#: The events' topic suffixes.
SUFFIXES = {"watch.fired": "fired", "watch.cleared": "cleared", "watch.narration": "narration"}
STATES = {"watch.fired": "ON", "watch.cleared": "OFF"}
PUBLISH_TIMEOUT_S = 10.0


def broker(url: str) -> dict[str, Any]:
    """``mqtt://[user:password@]host[:port]`` as aiomqtt's client arguments. Raises ``ValueError``."""
    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise ValueError(f"mqtt_url is mqtt://[user:password@]host[:port], not {url[:80]!r}")
    return {"hostname": parts.hostname, "port": parts.port or 1883,
            "username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else None}


class MqttLink:
    """The server's connection to its broker (``run`` in the server's task group)."""

    def __init__(self, url: str, discovery_prefix: str = "homeassistant", retry_max_s: float = 30.0) -> None:
        self.arguments = broker(url)
        self.discovery_prefix = discovery_prefix
        self.retry_max_s = retry_max_s
        self._client: aiomqtt.Client | None = None
        self.connected = anyio.Event()
        self.published = 0
        self.connects = 0
        self.on_connect: Callable[[], Awaitable[None]] | None = None  # announces the streams again

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                async with aiomqtt.Client(**self.arguments, identifier="livesight-" + secrets.token_hex(6)) as client:
                    self._client = client
                    self.connects += 1
                    failures = 0
                    self.connected.set()
                    if self.on_connect is not None:
                        await self.on_connect()
                    async for _ in client.messages:  # nothing subscribed: returns only when the link drops
                        pass
            except aiomqtt.MqttError as exc:
                log.warning("MQTT broker %s: %s", self.arguments["hostname"], exc)
            finally:
                self._client = None
                if self.connected.is_set():
                    self.connected = anyio.Event()
            failures += 1
            await anyio.sleep(backoff_s(failures, 1.0, self.retry_max_s))

    async def publish(self, topic: str, body: bytes | str, retain: bool = False) -> None:
        """Publish at QoS 1. Raises ``RuntimeError`` while the broker is not connected."""
        client = self._client
        if client is None:
            raise RuntimeError("not connected to the MQTT broker")
        await client.publish(topic, body, qos=1, retain=retain, timeout=PUBLISH_TIMEOUT_S)
        self.published += 1

    async def deliver(self, delivery: Delivery) -> None:
        """One event of the outbox: on its topic, and the watch's state when it changes."""
        event = delivery.event
        topic = str(delivery.target["topic"]).rstrip("/")
        watch = str(event.body.get("watch_id") or "stream")
        await self.publish(f"{topic}/{watch}/{SUFFIXES.get(event.kind, event.kind)}", payload(event))
        if event.kind in STATES:
            await self.publish(f"{topic}/{watch}/state", STATES[event.kind], retain=True)

    async def discover(self, stream_id: str, name: str | None, topic: str, watches: dict[str, str]) -> None:
        """Announce each watch of a stream to Home Assistant as a binary sensor (retained)."""
        topic = topic.rstrip("/")
        for watch_id, condition in watches.items():
            unique = f"livesight_{stream_id}_{watch_id}"
            config = {
                "name": condition or watch_id, "unique_id": unique, "object_id": unique,
                "state_topic": f"{topic}/{watch_id}/state", "payload_on": "ON", "payload_off": "OFF",
                "json_attributes_topic": f"{topic}/{watch_id}/fired",
                "device": {"identifiers": [f"livesight_{stream_id}"], "name": name or stream_id,
                           "manufacturer": "livesight", "model": "camera stream"},
            }
            await self.publish(f"{self.discovery_prefix}/binary_sensor/{unique}/config", json.dumps(config), retain=True)
