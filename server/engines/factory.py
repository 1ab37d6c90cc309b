"""Which engine a server runs: the one place that turns settings into an ``Engine``."""

from __future__ import annotations

from server.engines.base import Engine
from server.settings import Settings


def create_engine(settings: Settings) -> Engine:
    """The engine named by ``settings.engine``, serving ``settings.model`` (or the demo model);
    a model that declares the longest prompt it handles (the demo model's card) gets sessions
    whose prompts stay within it (``Capabilities.max_images``, which caps ``max_frames``).

    Raises ``ValueError`` when the settings cannot make that engine (engine=openai with no URL).
    """
    if settings.engine == "openai":
        from server.engines.openai import OpenAIEngine

        if not settings.openai_urls:
            raise ValueError("engine=openai needs openai_urls (LIVESIGHT_OPENAI_URLS=http://host:8000)")
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        return OpenAIEngine(
            settings.openai_urls,
            model=settings.model,
            api_key=key,
            timeout_s=settings.openai_timeout_s,
            health_interval_s=settings.openai_health_interval_s,
            audio_output=settings.openai_audio,
            max_image_side=settings.max_image_side,
            max_images=settings.max_images_per_prompt,
            image_references=settings.openai_image_references,
            max_warmups_per_s=settings.max_warmups_per_s,
            session_headers=tuple(settings.openai_session_headers),
        )

    from server.models.demo import declared_prompt_frames, resolve_model

    model = resolve_model(settings)
    declared = declared_prompt_frames(model)
    if settings.engine == "vllm":
        from server.engines.vllm_engine import VllmEngine

        args = vllm_engine_args(settings)
        if declared is not None:
            args["limit_mm_per_prompt"] = {"image": min(declared, settings.max_images_per_prompt)}
        return VllmEngine(
            model,
            engine_args=args,
            trust_remote_code=settings.trust_remote_code,
            max_image_side=settings.max_image_side,
            max_warmups_per_s=settings.max_warmups_per_s,
        )

    from server import blocking
    from server.engines.transformers_engine import TransformersEngine

    return TransformersEngine(
        model,
        max_images=declared,
        device=settings.device,
        dtype=settings.dtype,
        trust_remote_code=settings.trust_remote_code,
        max_cached_tokens=settings.max_cached_tokens,
        max_image_side=settings.max_image_side,
        max_cached_images=settings.max_cached_images,
        model_nice=settings.model_nice,
        model_threads=settings.model_threads,
        yield_to=blocking.frames_busy,
        max_yield_ms=settings.model_yield_ms,
        kv_shift=settings.kv_shift,
    )


def vllm_engine_args(settings: Settings) -> dict[str, object]:
    """vLLM engine arguments from the settings; unset ones are left to vLLM's defaults."""
    args: dict[str, object] = {
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "dtype": settings.dtype,
        "enforce_eager": settings.enforce_eager,
        "limit_mm_per_prompt": {"image": settings.max_images_per_prompt},
    }
    optional = {
        "max_model_len": settings.max_model_len,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "kv_cache_memory_bytes": settings.kv_cache_memory_bytes,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    args.update(settings.vllm_args)
    return args
