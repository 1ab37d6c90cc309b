"""Reconnects routed by an existing load balancer: HAProxy (the Debian package, on
docker/haproxy.cfg) in front of two livesight gateways (``livesight serve`` processes on the
tiny model), hashing on the routing key that every connection of a client carries in its URL.

A session whose TCP connection drops resumes through HAProxy on the gateway that parked it
(``resumed``, its follow-up warm); sessions with other keys use both gateways; after the
session's gateway is drained (SIGTERM), its client reconnects through HAProxy to the other
gateway, is told ``resume_failed``, starts afresh there, and every frame it was told was
acked is in the new session (resent from the client's replay buffer).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.app import WS_PATH
from server.background import ServedProcess, serve_process
from server.bench.router import Haproxy, haproxy
from server.client.stream import StreamClient
from tests.protocol_client import jpeg_frame

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

CONFIG = {"enable_frame_filter": False, "sampling": {"max_tokens": 4, "temperature": 0}}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module: its gateways and HAProxy are shared by its tests."""
    return "asyncio"


@pytest.fixture(scope="module")
def gateways(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServedProcess]]:
    """Two livesight gateways on the tiny model, each in its own process."""
    logs = tmp_path_factory.mktemp("gateways")
    args = ["--model", str(tiny_model_dir), "--log-level", "warning", "--drain-timeout-s", "5"]
    with serve_process(args, log_path=logs / "gateway1.log") as first, \
            serve_process(args, log_path=logs / "gateway2.log") as second:
        yield [first, second]


@pytest.fixture(scope="module")
def balancer(gateways: list[ServedProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Haproxy]:
    """HAProxy hashing the gateways' tier on the URL's routing key."""
    log_path = tmp_path_factory.mktemp("haproxy") / "haproxy.log"
    with haproxy(log_path, gateways=[f"{g.host}:{g.port}" for g in gateways]) as running:
        yield running


def sessions_on(gateway: ServedProcess) -> int:
    return httpx.get(gateway.http_url + "/metrics.json", timeout=10).json()["sessions"]


async def stream_frames(client: StreamClient, first: int, count: int) -> list[int]:
    ids = [await client.send_frame(jpeg_frame(700 + i), frame_id=i, pts_ms=500.0 * i) for i in range(first, first + count)]
    return ids


async def test_a_dropped_connection_resumes_on_the_gateway_that_holds_it(
    balancer: Haproxy, gateways: list[ServedProcess]
) -> None:
    """Drop a session's TCP connection: its client reconnects through HAProxy with the same
    routing key, lands on the same gateway and resumes (warm follow-up); every request with
    one key went to one gateway, and the keys of several clients used both."""
    url = balancer.gateways_url.replace("http", "ws", 1) + WS_PATH
    async with StreamClient.connect(url, CONFIG, route="resume-me") as client:
        await stream_frames(client, 0, 3)
        first = await (await client.ask("What is there?")).wait(120)
        holder = [sessions_on(g) for g in gateways]
        assert sorted(holder) == [0, 1] and first.status == "completed"
        client.ws.transport.abort()  # the TCP connection drops: no close frame
        for _ in range(300):
            if client.resumes:
                break
            await asyncio.sleep(0.1)
        assert client.resumes == 1 and client.ready.resumed, client.ready
        assert [sessions_on(g) for g in gateways] == holder
        follow_up = await (await client.ask("And now?")).wait(120)
        assert follow_up.status == "completed" and follow_up.frame_ids == [0, 1, 2]
        assert follow_up.usage["cached_tokens"] >= 0.9 * follow_up.usage["prompt_tokens"], follow_up.usage
    for key in (f"client-{i}" for i in range(12)):
        async with StreamClient.connect(url, CONFIG, route=key, resume=False):
            pass
    served = {}
    for request in balancer.requests():
        if request.backend == "livesight" and request.key:
            served.setdefault(request.key, set()).add(request.server)
    assert served["resume-me"] and len(served["resume-me"]) == 1, served
    assert all(len(servers) == 1 for servers in served.values()), served
    assert set().union(*served.values()) == {"gateway1", "gateway2"}, served


async def test_a_drained_gateway_sends_its_session_afresh_to_the_other(
    balancer: Haproxy, gateways: list[ServedProcess]
) -> None:
    """SIGTERM the gateway holding a session: the session is closed (1012) once drained, its
    client reconnects through HAProxy to the other gateway, which cannot resume it
    (``resume_failed``) and starts a fresh session; the frames acked before are all in its
    next answer's prompt (resent from the client's replay buffer)."""
    url = balancer.gateways_url.replace("http", "ws", 1) + WS_PATH
    async with StreamClient.connect(url, CONFIG, route="drain-me") as client:
        sent = await stream_frames(client, 10, 4)
        before = await (await client.ask("What is there?")).wait(120)
        assert before.frame_ids == sent
        holder = next(g for g in gateways if sessions_on(g) == 1)
        other = next(g for g in gateways if g is not holder)
        holder.proc.send_signal(signal.SIGTERM)
        for _ in range(600):
            if client.resumes:
                break
            await asyncio.sleep(0.1)
        assert client.resumes == 1 and not client.ready.resumed
        assert sessions_on(other) == 1
        after = await (await client.ask("And now?")).wait(120)
        assert after.status == "completed" and after.frame_ids == sent, (after.frame_ids, sent)
    assert holder.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
