"""Two servers sharing a real PostgreSQL database share their streams: a stream is pulled by
exactly one of them (a lease in the database); either answers for it (status, a change of its
watches); when its server is killed, the other takes it within a lease time, delivers the
fires the dead one kept but could not deliver, and goes on firing: no fire is lost, and a fire
sent twice is sent under its one idempotency key."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from server.background import ServedProcess, serve_process
from server.bench.camera_servers import WebhookReceiver
from server.bench.footage import write_colour_clip
from tests.postgres_server import create_database, drop_database

pytestmark = pytest.mark.timeout(240)

SECRET = "whsec-replica-secret"
LEASE_S = 3.0
ALWAYS = {"threshold": 0, "clear_threshold": 0, "cooldown_s": 1}


@pytest.fixture
def database(postgres_url: str) -> Iterator[str]:
    """A fresh database on the run's PostgreSQL server, dropped after the test."""
    url = anyio.run(create_database, postgres_url, "replicas")
    try:
        yield url
    finally:
        anyio.run(drop_database, postgres_url, url)


def _events_in(url: str, stream_id: str) -> set[str]:
    async def read() -> set[str]:
        db = await asyncpg.connect(url)
        try:
            rows = await db.fetch("SELECT event_id FROM livesight.stream_events WHERE stream_id = $1", stream_id)
        finally:
            await db.close()
        return {r["event_id"] for r in rows}

    return anyio.run(read)


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _status(server: ServedProcess, stream_id: str) -> dict[str, Any]:
    return httpx.get(f"{server.http_url}/v1/streams/{stream_id}", timeout=30).json()


def test_a_killed_servers_stream_moves_to_the_other_with_every_fire_delivered(
        tiny_model_dir: Path, database: str, tmp_path: Path) -> None:
    """Kill the server that pulls a stream while its fires wait for a receiver that is down: the
    other takes the stream within a few lease times, and every fire is delivered, signed, once per key."""
    clip = tmp_path / "screen.mp4"
    write_colour_clip(clip, [("red", 2.0), ("grey", 2.0)], fps=10)
    receiver = WebhookReceiver(SECRET, failures=10**9)  # down while the first server lives
    args = ["--model", str(tiny_model_dir), "--memory-url", database, "--stream-lease-s", str(LEASE_S),
            "--resume-grace-s", "0", "--webhook-timeout-s", "2", "--webhook-max-retry-s", "1"]
    try:
        with serve_process([*args, "--data-dir", str(tmp_path / "a")], log_path=tmp_path / "a.log",
                           start_timeout_s=180, stop_timeout_s=0) as first, \
                serve_process([*args, "--data-dir", str(tmp_path / "b")], log_path=tmp_path / "b.log",
                              start_timeout_s=180) as second:
            created = httpx.post(f"{first.http_url}/v1/streams", timeout=30, json={
                "source": f"file://{clip}", "loop": True, "fps": 2, "config": {"sampling": {"max_tokens": 2}},
                "watches": [{"watch_id": "any", "condition": "Is there a screen?", **ALWAYS}],
                "deliver": {"webhook": {"url": receiver.url, "secret": SECRET}}})
            assert created.status_code == 201, created.text
            stream_id, first_id = created.json()["stream_id"], created.json()["server"]
            # the second server answers for it as its server last said, and changes it there
            seen = _until(lambda: (s := _status(second, stream_id)).get("frames_sampled", 0) > 0 and s, 60,
                          "the stream's status through the other server")
            assert seen["server"] == first_id and seen["state"] == "live", seen
            listed = httpx.get(f"{second.http_url}/v1/streams", timeout=30).json()["streams"]
            assert [s["stream_id"] for s in listed] == [stream_id]
            patched = httpx.patch(f"{second.http_url}/v1/streams/{stream_id}", timeout=30, json={
                "watches": [{"watch_id": "still", "condition": "Is there still a screen?", **ALWAYS}]})
            assert patched.status_code == 200, patched.text
            _until(lambda: [w["watch_id"] for w in _status(first, stream_id)["watches"]] == ["still"], 30,
                   "the change applied by the stream's own server")
            _until(lambda: _status(first, stream_id)["deliveries"].get("pending", 0) >= 2, 60,
                   "fires kept while the receiver is down")

            os.kill(first.proc.pid, signal.SIGKILL)  # no drain, no release: the lease runs out
            first.proc.wait(10)
            killed_at, killed_ms = time.monotonic(), time.time() * 1000
            receiver.failures = 0
            _until(lambda: _status(second, stream_id).get("server") != first_id, 60, "the stream's lease taken")
            leased_s = time.monotonic() - killed_at
            moved = _until(lambda: (s := _status(second, stream_id)).get("server") != first_id
                           and s.get("frames_sampled", 0) > 0 and s, 60, "the stream taken by the other server")
            took_s = time.monotonic() - killed_at
            assert moved["server"] != first_id and moved["watches"][0]["watch_id"] == "still", moved
            assert took_s < 5 * LEASE_S, f"taken {took_s:.1f} s after the kill with a {LEASE_S} s lease"
            assert leased_s < 2 * LEASE_S, f"leased {leased_s:.1f} s after the kill with a {LEASE_S} s lease"
            print(f"the stream's lease was taken {leased_s:.1f} s after its server was killed ({LEASE_S} s lease), "
                  f"its first frame sampled there {took_s:.1f} s after")
            _until(lambda: any(r["body"]["type"] == "watch.fired" and r["body"]["at_ms"] > killed_ms
                               for r in receiver.accepted().values()), 60, "a fire of the new server")
            # no more fires; then every event kept (fires, narrations) is delivered, and nothing else
            assert httpx.patch(f"{second.http_url}/v1/streams/{stream_id}", timeout=30,
                               json={"watches": []}).status_code == 200
            _until(lambda: (k := _events_in(database, stream_id)) == set(receiver.accepted())
                          and _status(second, stream_id)["deliveries"].get("pending", 0) == 0 and k, 60,
                          "every event kept, delivered")
            fired_before = [r for r in receiver.accepted().values() if r["body"]["at_ms"] < killed_ms]
            assert len(fired_before) >= 2, "the fires the killed server kept were delivered by the other"
            sent = {r["event_id"] for r in receiver.requests}  # a narration may still be on its way:
            assert sent <= _events_in(database, stream_id)  # nothing was sent that was not kept first
            assert all(r["signed"] for r in receiver.requests)
    finally:
        receiver.close()
