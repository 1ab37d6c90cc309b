"""Prometheus metrics at /metrics: the families, their labels, and counts that follow a session."""

from __future__ import annotations

import base64

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.background import RunningServer
from server.metrics import Metrics, wav_seconds
from server.speech.wav import encode_wav
from tests.protocol_client import b64, connect

pytestmark = pytest.mark.anyio

FAMILIES = {
    "livesight_sessions": "gauge",
    "livesight_sessions_parked": "gauge",
    "livesight_frames": "counter",
    "livesight_ack_latency_seconds": "histogram",
    "livesight_ttft_seconds": "histogram",
    "livesight_event_loop_lag_seconds": "histogram",
    "livesight_answers": "counter",
    "livesight_errors": "counter",
    "livesight_prompt_tokens": "counter",
    "livesight_cached_tokens": "counter",
    "livesight_completion_tokens": "counter",
    "livesight_kv_cache_tokens": "gauge",
    "livesight_audio_input_seconds": "counter",
    "livesight_audio_output_seconds": "counter",
}


async def scrape(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}; checks the family types."""
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    types = {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, (name, types.get(name))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_a_session_that_answered_shows_in_the_metrics(server: RunningServer) -> None:
    """After frames (one a near-duplicate, one bad), audio and an answer, every family moved as due."""
    before = await scrape(server)
    client, _ = await connect(server, sampling={"max_tokens": 4, "temperature": 0}, max_frames=2, prefix_warmup=False)
    await client.frame(1, seed=11)
    await client.frame(2, seed=11)  # the same picture: filtered
    await client.frame(3, seed=12)
    await client.frame(4, seed=13)  # the buffer holds 2: one evicted
    await client.send(type="video.frame", data="not base64!", frame_id=5)
    assert (await client.recv_type("error"))["code"] == "invalid_image"
    await client.send(type="audio.chunk", data=b64(b"\0\0" * 16_000))  # one second
    during = await scrape(server)
    assert value(during, "livesight_sessions", protocol="video_chat") >= 1
    done = (await client.ask("What is there?"))[-1]
    assert done["status"] == "completed"
    await client.ws.close()
    after = await scrape(server)

    def grew(name: str, by: float = 1, **labels: str) -> None:
        assert value(after, name, **labels) - value(before, name, **labels) >= by, (name, labels)

    grew("livesight_frames_total", 3, outcome="accepted")
    grew("livesight_frames_total", 1, outcome="filtered")
    grew("livesight_frames_total", 1, outcome="evicted")
    grew("livesight_frames_total", 1, outcome="invalid")
    grew("livesight_errors_total", 1, code="invalid_image")
    grew("livesight_ack_latency_seconds_count", 4)
    grew("livesight_ttft_seconds_count")
    grew("livesight_answers_total", status="completed")
    grew("livesight_prompt_tokens_total", done["usage"]["prompt_tokens"])
    grew("livesight_completion_tokens_total")
    grew("livesight_audio_input_seconds_total", 0.99)
    assert value(after, "livesight_kv_cache_tokens") >= 0
    assert value(after, "livesight_errors_total", code="too_many_sessions") >= 0  # every code is there from the start


def test_apps_in_one_process_keep_their_own_metrics() -> None:
    """Two Metrics objects (two apps) register the same names without colliding or sharing counts."""
    first, second = Metrics(), Metrics(lambda: 7)
    first.answers.labels("completed").inc()
    assert b'livesight_answers_total{status="completed"} 1.0' in first.render()
    assert b'livesight_answers_total{status="completed"} 0.0' in second.render()
    assert b"livesight_kv_cache_tokens 7.0" in second.render()


def test_speech_seconds_come_from_the_wav_header() -> None:
    """An audio delta's duration is read from its WAV header and size, for any rate."""
    wav = base64.b64encode(encode_wav(b"\0\0" * 12_000, rate=24_000)).decode()
    assert wav_seconds(wav) == pytest.approx(0.5)
    assert wav_seconds(base64.b64encode(encode_wav(b"\0\0" * 16_000, rate=16_000)).decode()) == pytest.approx(1.0)
    assert wav_seconds("bm90IGEgd2F2") == 0.0


async def test_every_metric_the_dashboard_queries_exists(server: RunningServer) -> None:
    """Each livesight_* series named in the Grafana dashboard is a sample of a running server's /metrics."""
    import json
    import re
    from pathlib import Path

    dashboard = Path(__file__).resolve().parents[3] / "docker" / "monitoring" / "grafana" / "dashboards" / "livesight.json"
    panels = json.loads(dashboard.read_text())["panels"]
    queried = {name for p in panels for t in p["targets"] for name in re.findall(r"livesight_[a-z_]+", t["expr"])}
    assert len(queried) >= 10
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("sessions", "frames", "ack latency", "first output", "cache", "errors"):
        assert topic in titles, topic
    exposed = {name for name, _ in await scrape(server)}
    assert queried <= exposed, queried - exposed
