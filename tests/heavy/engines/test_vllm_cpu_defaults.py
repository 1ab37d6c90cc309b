"""engine=vllm on a CPU with no memory flag: livesight sizes vLLM's KV cache to the machine
(tests/heavy/engines/test_engine_vllm.py's engine starts that way)."""

from __future__ import annotations

from server.engines.vllm_engine import CPU_KV_MAX_BYTES, CPU_KV_MIN_BYTES, MiB, cpu_kv_cache_bytes, with_cpu_kv_default

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
