"""The embedded engine: an image-text model run with transformers, on CPU or GPU.

Every model step (preprocessing a new image, a prefill chunk, one decoding step) is one job
on a single model thread (``model_thread``: torch's parallel workers run ``model_nice``
steps below the server's CPU priority), so steps of different sessions interleave fairly and an abort
takes effect within one step. A warmup's chunks hold at most one image each, so a question
that cancels a warmup (or a re-warm after an eviction) waits behind the frame being
prefilled, never behind the whole window. Each session keeps a KV cache that is extended as
its prompt grows and cut back to the longest still-valid prefix when it changes (see
``kv_cache``).

A check (``check``: yes or no, from the next token's distribution) runs the prompts of one
call together, in one model step (more only past ``prefill_chunk_tokens`` new tokens): each
prompt's tokens beyond what the session's cache shares with it (its question, on a warm
prefix) are run after the cache, as scratch, side by side, each masked from the others, and
cut off again in the same step, so nothing of it is kept and no other job ever sees it. Where
the cache holds more than a prompt's shared prefix (an answer's tokens), that prompt's
scratch tokens are masked from that part instead of the cache being cut back to it.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import torch

from server.engines.base import (
    CAPTION_REQUEST_PREFIX,
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
)
from server.engines.detokenizer import IncrementalDetokenizer
from server.engines.hf_loading import load_model, load_processor, model_family, model_image_side
from server.engines.growable_cache import crop_to, new_cache
from server.engines.kv_cache import CacheBudget, SessionCache
from server.engines.kv_shift import can_shift, plan_shift, put_run, rotary_frequencies, take_run
from server.engines.model_thread import ModelThread, Priority
from server.engines.prompt_encoding import Piece, PromptEncoder
from server.engines.yes_no import answer_token_ids, yes_probability

log = logging.getLogger("livesight.engines")
T = TypeVar("T")
CLOSE_JOIN_S = 10.0  # the longest ``close`` waits for the model thread's last job


class TransformersEngine(Engine):
    """An image-text model loaded with transformers, with per-session warm KV caches."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        trust_remote_code: bool = False,
        max_cached_tokens: int = 200_000,
        prefill_chunk_tokens: int = 512,
        max_image_side: int = 1024,
        max_cached_images: int = 128,
        model_nice: int = 0,
        model_threads: int = 0,
        yield_to: Callable[[], bool] | None = None,
        max_yield_ms: float = 0.0,
        max_images: int | None = None,
        kv_shift: bool = True,
    ) -> None:
        self.kv_shift = kv_shift  # move a prefix that lost frames at its front (``kv_shift``)
        self._inv_freq: torch.Tensor | None = None
        self.shifts = 0
        self.computed: Counter[str] = Counter()  # prompt tokens computed, by work: warm, check, answer, caption
        self.max_cached_images = max_cached_images
        self._max_images = max_images  # the most frames a prompt may hold (None: no limit)
        self.model_path = model_path
        self.device = device
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.budget = CacheBudget(max_cached_tokens)
        self._max_image_side = max_image_side
        self._model_threads = model_threads  # 0: by the model's size (``_threads_for``)
        self._model_thread = ModelThread(
            nice=model_nice, start_workers=_start_parallel_workers, yield_to=yield_to, max_yield_s=max_yield_ms / 1000
        )
        self.model: Any = None
        self.encoder: PromptEncoder | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._yes_ids = self._no_ids = torch.empty(0, dtype=torch.long)
        self.capabilities = Capabilities(
            name="transformers", model=model_path, warm_prefix=True, token_probabilities=True, max_images=max_images
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load model and processor. Raises ``EngineError`` when they cannot be loaded."""
        try:
            await self._run(self._load)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise EngineError(f"cannot load model {self.model_path!r}: {exc}") from exc

    def _load(self) -> None:
        self.model = load_model(self.model_path, self.dtype, self.device, self.trust_remote_code)
        torch.set_num_threads(self._model_threads or _threads_for(self.model))  # this (the model) thread's
        processor = load_processor(self.model_path, self.trust_remote_code)
        family = model_family(self.model.config)
        self.encoder = PromptEncoder(processor, family, self.max_cached_images)
        stop = self.model.generation_config.eos_token_id
        stop = [stop] if isinstance(stop, int) else list(stop or [])
        if processor.tokenizer.eos_token_id is not None:
            stop.append(processor.tokenizer.eos_token_id)
        self._stop_ids = frozenset(stop)
        yes, no = answer_token_ids(processor.tokenizer)
        self._yes_ids = torch.tensor(yes, dtype=torch.long)
        self._no_ids = torch.tensor(no, dtype=torch.long)
        side = model_image_side(processor.image_processor, self._max_image_side)
        self._inv_freq = rotary_frequencies(self.model) if self.kv_shift else None
        self.capabilities = Capabilities(
            name="transformers", model=self.model_path, warm_prefix=True, max_image_side=side,
            token_probabilities=True, max_images=self._max_images, shifts_prefix=self._inv_freq is not None,
        )
        log.info("transformers engine: %s (%s family) on %s", self.model_path, family, self.device)

    async def close(self) -> None:
        """Clear the caches and stop the model thread, waiting up to ``CLOSE_JOIN_S`` for it (a
        process that exits while it still frees tensors may abort)."""
        self.budget.clear()
        self.model = None
        thread = self._model_thread.close()
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, CLOSE_JOIN_S)

    async def release(self, session_id: str) -> None:
        await self._run(self.budget.drop, session_id)

    def kv_cache_tokens(self) -> int:
        """Tokens in every session's KV cache (read without the model thread: a snapshot)."""
        return self.budget.total_tokens

    def stats(self) -> EngineStats:
        """Prefix shifts done and prompt tokens computed since the engine started."""
        return EngineStats(prompt_tokens_computed=dict(self.computed), kv_shifts=self.shifts)

    # ------------------------------------------------------------------ requests
    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        """Extend the session's cache over ``prompt``; returns the cached token count.

        New images are preprocessed one per model-thread job, like the prefill steps, so a
        query waits behind one frame's work at most."""
        await self._preprocess_new_images(prompt, Priority.WARMUP)
        pieces = await self._run(self._encode, prompt, priority=Priority.WARMUP)
        with self.budget.hold(session_id):
            cache = await self._run(self._reuse, session_id, pieces, False, priority=Priority.WARMUP)
            todo = _remaining(pieces, cache.length)
            for chunk in _chunks(todo, self.prefill_chunk_tokens, one_image=True):
                await self._run(self._forward, session_id, cache, chunk, "warm", priority=Priority.WARMUP)
            return cache.length

    async def check(self, session_id: str, request_id: str, prompts: list[Prompt]) -> list[CheckResult]:
        """How likely each prompt's answer starts with yes; see ``Engine.check``.

        New images are preprocessed first, one per job, as for ``prefill``; then the prompts
        are encoded in one job and run together over the session's cache, one model step per
        ``prefill_chunk_tokens`` of new tokens (a warm session's watches: one step), so
        cancelling stops between steps and the cache is as it was either way, but for new
        frames all the prompts go on with after the whole cache, which it keeps (the warm
        prefix's next frames: ``_check_step``).
        ``cached_tokens``: the prompt's tokens the session's cache already held. Raises
        ``EngineError``.
        """
        if any(prompt.open_turn for prompt in prompts):
            raise EngineError("a check needs a closed question turn")
        results: list[CheckResult] = []
        with self.budget.hold(session_id):  # another session's step must not evict this cache
            for prompt in prompts:
                await self._preprocess_new_images(prompt, Priority.CHECK)
            for step in await self._run(self._check_steps, session_id, prompts, priority=Priority.CHECK):
                results += await self._run(self._check_step, session_id, step, priority=Priority.CHECK)
        return results

    async def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        """Stream the answer; see ``Engine.generate``."""
        pieces = await self._run(self._encode, prompt)
        prompt_tokens = sum(len(p.ids) for p in pieces)
        work = "caption" if request_id.startswith(CAPTION_REQUEST_PREFIX) else "answer"
        with self.budget.hold(session_id):  # another session's step must not evict this cache
            cache = await self._run(self._reuse, session_id, pieces, True)
            cached = cache.length
            logits = None
            for chunk in _chunks(_remaining(pieces, cached), self.prefill_chunk_tokens):
                logits = await self._run(self._forward, session_id, cache, chunk, work)
            if logits is None:
                raise EngineError("empty prompt")
            detok = IncrementalDetokenizer(self.encoder.tokenizer, skip_special_tokens=True)
            generator = torch.Generator().manual_seed(
                sampling.seed if sampling.seed is not None else random.getrandbits(63)
            )
            produced = 0
            reason = "length"
            while produced < sampling.max_tokens:
                token = _sample(logits, sampling, generator)
                produced += 1
                if token in self._stop_ids:
                    reason = "stop"
                    break
                text = detok.push(token)
                if text:
                    yield TextDelta(text)
                if produced >= sampling.max_tokens:
                    break
                logits = await self._run(self._forward, session_id, cache, [Piece((token,))])
            tail = detok.flush()
            if tail:
                yield TextDelta(tail)
            images = self.encoder.image_tokens(pieces)
            spoken = min(self.encoder.text_tokens(prompt.spoken), prompt_tokens - images)
            yield Finished(reason, Usage(prompt_tokens, cached, produced, images, spoken))

    # ------------------------------------------------------------------ model-thread jobs
    async def _run(self, fn: Callable[..., T], *args: Any, priority: Priority = Priority.ANSWER) -> T:
        """Run one model step on the model thread, at ``priority`` (answers first, then warm
        prefixes, then checks). Cancellation waits for the step."""
        try:
            return await self._model_thread.run(fn, *args, priority=priority)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            if self.model is None:
                raise EngineError("engine is closed") from exc
            log.exception("model step failed")
            raise EngineError(f"model step failed: {type(exc).__name__}") from exc

    async def _preprocess_new_images(self, prompt: Prompt, priority: Priority) -> None:
        """Run the processor on the prompt's images it has not seen, one model-thread job each."""
        if self.encoder is not None:
            for image in _images(prompt):
                if not self.encoder.knows(image):
                    await self._run(self.encoder.image_piece, image, priority=priority)

    def _encode(self, prompt: Prompt) -> list[Piece]:
        if self.encoder is None:
            raise EngineError("engine not started")
        return self.encoder.encode(prompt)

    def _reuse(self, session_id: str, pieces: list[Piece], need_logits: bool) -> SessionCache:
        """Cut the session's cache back to its longest prefix shared with ``pieces``."""
        cache = self.budget.get(session_id)
        self._slide(session_id, cache, pieces)
        matched, whole = cache.common_prefix(pieces)
        total = sum(len(p.ids) for p in pieces)
        if need_logits and matched >= total:
            # the last prompt token must be computed again to get logits for the answer
            last = pieces[-1]
            matched = total - (len(last.ids) if last.image_key else 1)
        cache.crop(matched)
        return cache

    @torch.inference_mode()
    def _slide(self, session_id: str, cache: SessionCache, pieces: list[Piece]) -> None:
        """Where frames left the front of the prompt, move the cached run that follows them up
        (``kv_shift``): keep the head, compute the few tokens between it and the run, append the
        run rotated back by the gap. A cache that cannot move is left to be cut back."""
        if self._inv_freq is None or not can_shift(cache.kv):
            return
        shift = plan_shift(cache, pieces)
        if shift is None or shift.keep == 0:
            return
        end = shift.start + shift.length
        run = take_run(cache.kv, shift.start, shift.length)
        ids, owners = cache.ids[shift.start : end], cache.owners[shift.start : end]
        next_positions = cache.next_positions[shift.start : end]
        was = cache.next_positions[shift.start - 1]  # the run's first position
        cache.crop(shift.keep)
        if shift.new:
            self._forward(session_id, cache, list(shift.new), "warm")
        by = cache.next_position - was
        put_run(cache.kv, run, by, self._inv_freq)
        cache.append(ids, owners, [n + by for n in next_positions])
        self.shifts += 1

    @torch.inference_mode()
    def _forward(self, session_id: str, cache: SessionCache, pieces: list[Piece], work: str | None = None) -> torch.Tensor:
        """Append ``pieces`` to the session's cache; returns the logits after the last token.
        ``work``: whose prompt tokens these are (counted in ``stats``; None: generated tokens)."""
        ids = [i for p in pieces for i in p.ids]
        positions, _ = self.encoder.position_ids(pieces, cache.next_position)
        if cache.kv is None:
            cache.kv = new_cache(self.model.config)
        try:
            out = self._model_step(cache.kv, pieces, positions)
        except BaseException:
            cache.clear()  # the KV tensors may hold part of this step
            raise
        self._kept(cache, pieces, positions)
        if work is not None:
            self.computed[work] += len(ids)
        self.budget.enforce(keep=session_id)
        return out.logits[0, -1].float().cpu()

    @staticmethod
    def _kept(cache: SessionCache, pieces: list[Piece], positions: torch.Tensor) -> None:
        """Record ``pieces``, just written into the cache's tensors at ``positions``, in its books."""
        ids = [i for p in pieces for i in p.ids]
        flat = positions.reshape(-1, len(ids)).max(dim=0).values
        next_positions = (torch.cummax(flat, dim=0).values + 1).tolist()
        next_positions = [max(n, cache.next_position) for n in next_positions]
        cache.append(ids, [p.image_key for p in pieces for _ in p.ids], next_positions)

    def _model_step(
        self, kv: Any, pieces: list[Piece], positions: torch.Tensor, mask: torch.Tensor | None = None,
        keep: torch.Tensor | int = 1,
    ) -> Any:
        """The model's forward over ``pieces`` after the tokens in ``kv`` (which it extends),
        keeping the logits of the last position (``keep``: of these positions among
        ``pieces``' tokens); ``mask``: which tokens each new one attends to (additive, 4D)."""
        if self.encoder.family.mrope:
            self.model.model.rope_deltas = None
        return self.model(
            input_ids=torch.tensor([[i for p in pieces for i in p.ids]], device=self.model.device),
            position_ids=positions.to(self.model.device),
            attention_mask=mask,
            past_key_values=kv,
            use_cache=True,
            logits_to_keep=keep,
            **{k: v.to(self.model.device) for k, v in _image_inputs(self.encoder, pieces).items()},
        )

    def _check_steps(self, session_id: str, prompts: list[Prompt]) -> list[list[list[Piece]]]:
        """The prompts of a check, encoded and grouped into model steps of at most
        ``prefill_chunk_tokens`` new tokens (what each does not share with the session's cache;
        a step holds one prompt at least), in order."""
        cache = self.budget.get(session_id)
        encoded = [self._encode(prompt) for prompt in prompts]
        if encoded:
            self._slide(session_id, cache, encoded[0])  # the prompts share the session's prefix
        steps: list[list[list[Piece]]] = []
        size = self.prefill_chunk_tokens
        for pieces in encoded:
            new = sum(len(p.ids) for p in pieces) - (cache.common_prefix(pieces)[0] if cache.kv is not None else 0)
            if steps and size + new <= self.prefill_chunk_tokens:
                steps[-1].append(pieces)
                size += new
            else:
                steps.append([pieces])
                size = new
        return steps

    @torch.inference_mode()
    def _check_step(self, session_id: str, prompts: list[list[Piece]]) -> list[CheckResult]:
        """One model step for the checks of ``prompts``: the logits after each, computed on the
        session's cache and cut off again before returning (a step that fails leaves the cache
        as it was, or empty).

        The tokens the cache shares with a prompt are reused; the rest run after the cache's
        last token, at the positions they have in the prompt, the prompts one after another in
        the step, each attending only to its shared prefix and to itself. Where the cache
        shares nothing with any prompt (a session without a warm prefix), the cache is not
        touched: the prompts run on a cache of their own.

        Where every prompt holds the whole cache and goes on with the same new frames (a round
        that came before the warm prefix took them: ``_fused_frames``), those frames run once,
        first, every prompt attending to them, and stay in the cache: the round warms them, and
        the prefix's next prefill finds them there instead of computing them again.
        """
        cache = self.budget.get(session_id)
        plans = [self._check_plan(cache, pieces) for pieces in prompts]
        on_session = cache.kv is not None and any(shared for shared, _, _ in plans)
        if not on_session:
            plans = [self._check_plan(None, pieces) for pieces in prompts]
        held = cache.length if on_session else 0
        kv = cache.kv if on_session else new_cache(self.model.config)
        frames = _fused_frames(plans, held) if on_session else []
        fused = sum(len(p.ids) for p in frames)
        frame_positions = plans[0][2][..., :fused]
        if fused:  # the prompts go on after the frames they share
            plans = [(shared, rest[len(frames):], pos[..., fused:]) for shared, rest, pos in plans]
        todo = frames + [p for _, rest, _ in plans for p in rest]
        positions = torch.cat([frame_positions] + [pos for _, _, pos in plans], dim=-1)
        lengths = [sum(len(p.ids) for p in rest) for _, rest, _ in plans]
        ends = torch.tensor(lengths).cumsum(0) - 1 + fused
        mask = None
        if len(plans) > 1 or plans[0][0] < held:
            mask = _scratch_mask([shared for shared, _, _ in plans], lengths, held, self.model.dtype, fused)
        kept = held
        try:
            out = self._model_step(kv, todo, positions, mask.to(self.model.device) if mask is not None else None,
                                   keep=ends.to(self.model.device))
            kept = held + fused
        finally:
            if on_session:
                try:
                    crop_to(kv, kept)
                except RuntimeError:  # a layer that cannot go back: the cache is lost, not wrong
                    cache.clear()
                    raise
        if fused:
            self._kept(cache, frames, frame_positions)
            self.computed["warm"] += fused
            self.budget.enforce(keep=session_id)
        self.computed["check"] += sum(lengths)
        probs = torch.softmax(out.logits[0].float(), dim=-1).cpu()
        return [
            CheckResult(_answer_probability(row, self._yes_ids, self._no_ids), sum(len(p.ids) for p in pieces),
                        shared if on_session else 0)
            for row, pieces, (shared, _, _) in zip(probs, prompts, plans, strict=True)
        ]

    def _check_plan(self, cache: SessionCache | None, pieces: list[Piece]) -> tuple[int, list[Piece], torch.Tensor]:
        """A check prompt on ``cache`` (None: on an empty one): the tokens it shares with the
        cache, the pieces left to run and their positions. Raises ``EngineError`` for an empty
        prompt."""
        total = sum(len(p.ids) for p in pieces)
        if not total:
            raise EngineError("empty prompt")
        shared = cache.common_prefix(pieces)[0] if cache is not None and cache.kv is not None else 0
        if shared >= total:  # the last prompt token must run again to give the answer's logits
            last = pieces[-1]
            shared = total - (len(last.ids) if last.image_key else 1)
        todo = _remaining(pieces, shared)
        positions, _ = self.encoder.position_ids(todo, cache.next_positions[shared - 1] if shared else 0)
        return shared, todo, positions


# ---------------------------------------------------------------------- helpers


def _answer_probability(probs: torch.Tensor, yes_ids: torch.Tensor, no_ids: torch.Tensor) -> float:
    """P(yes) / (P(yes) + P(no)) from the next token's probabilities (``yes_no``)."""
    vocab = probs.shape[-1]
    yes = float(probs[yes_ids[yes_ids < vocab]].sum())
    no = float(probs[no_ids[no_ids < vocab]].sum())
    return yes_probability(yes, no)


def _scratch_mask(shared: list[int], lengths: list[int], held: int, dtype: torch.dtype, fused: int = 0) -> torch.Tensor:
    """The additive attention mask (1, 1, new tokens, ``held`` + new tokens) of a check step:
    ``fused`` new tokens first (frames every run shares: causal, after the whole cache), then
    runs of ``lengths`` new tokens, each attending to the first ``shared`` tokens of the cache
    (its own count), to the fused tokens and causally to itself, to nothing else."""
    total = fused + sum(lengths)
    low = torch.finfo(dtype).min
    mask = torch.full((total, held + total), low, dtype=dtype)
    mask[:fused, : held + fused] = torch.cat([torch.zeros(fused, held), torch.triu(torch.full((fused, fused), low), 1)], 1)
    start = fused
    for prefix, n in zip(shared, lengths, strict=True):
        rows = slice(start, start + n)
        mask[rows, :prefix] = 0
        mask[rows, held : held + fused] = 0
        mask[rows, held + start : held + start + n] = torch.triu(torch.full((n, n), low), 1)
        start += n
    return mask[None, None]


def _fused_frames(plans: list[tuple[int, list[Piece], torch.Tensor]], held: int) -> list[Piece]:
    """The new pieces every check prompt of ``plans`` starts with, through the last image among
    them, when every prompt holds the session's whole cache of ``held`` tokens and goes on past
    them; else none (nothing to keep: the frames are already cached, or differ)."""
    if any(shared != held for shared, _, _ in plans):
        return []
    rests = [rest for _, rest, _ in plans]
    first = rests[0]
    common = 0
    while all(len(rest) > common + 1 and rest[common] == first[common] for rest in rests):
        common += 1
    images = [k for k in range(common) if first[k].image_key is not None]
    return first[: images[-1] + 1] if images else []


def _images(prompt: Prompt) -> list[ImageSegment]:
    return [seg for turn in prompt.turns for seg in turn.segments if isinstance(seg, ImageSegment)]


def _remaining(pieces: list[Piece], cached: int) -> list[Piece]:
    """The part of ``pieces`` after the first ``cached`` tokens."""
    out: list[Piece] = []
    skip = cached
    for piece in pieces:
        n = len(piece.ids)
        if skip >= n:
            skip -= n
            continue
        if skip:
            out.append(Piece(piece.ids[skip:]))  # only text pieces are ever split
            skip = 0
        else:
            out.append(piece)
    return out


def _chunks(pieces: list[Piece], limit: int, one_image: bool = False) -> list[list[Piece]]:
    """Group pieces into prefill steps of about ``limit`` tokens (images are not split); with
    ``one_image`` (warmup) at most one image a step, so a query that cancels a warmup waits
    for one frame at most."""
    steps: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for piece in pieces:
        if piece.image_key is None:
            ids = piece.ids
            while ids:
                room = max(limit - size, 0)
                if room == 0:
                    steps.append(current)
                    current, size = [], 0
                    continue
                current.append(Piece(ids[:room]))
                size += len(ids[:room])
                ids = ids[room:]
            continue
        if current and (size + len(piece.ids) > limit or (one_image and any(p.image_key for p in current))):
            steps.append(current)
            current, size = [], 0
        current.append(piece)
        size += len(piece.ids)
    if current:
        steps.append(current)
    return steps


def _image_inputs(encoder: PromptEncoder, pieces: list[Piece]) -> dict[str, torch.Tensor]:
    """Concatenate the processor outputs of the images among ``pieces``."""
    images = [encoder.pixel_inputs(p) for p in pieces if p.image_key is not None]
    if not images:
        return {}
    dim = 0 if encoder.family.mrope else 1  # Qwen: (patches, dim) rows; Idefics3: (batch, images, ...)
    return {k: torch.cat([img[k] for img in images], dim=dim) for k in images[0]}


def _sample(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """Pick the next token: greedy at temperature 0, else temperature + top-p sampling."""
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


#: A model with fewer parameters runs its steps on one thread: each of its operations is too
#: small to share, and a second thread only spins between them, taking the core that intake,
#: decoding and the event loop need (twenty cameras on two cores: 92 against 57 ms of CPU a
#: second per camera).
SMALL_MODEL_PARAMETERS = 50_000_000


def _threads_for(model: Any) -> int:
    """Torch threads for ``model``'s steps: one for a small model, else torch's default."""
    if sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS:
        return 1
    return torch.get_num_threads()


def _start_parallel_workers() -> None:
    """Make torch start its parallel worker threads now, from the calling thread (an
    elementwise op and a matrix product, each large enough to run in parallel)."""
    with torch.inference_mode():
        torch.ones(1 << 20).add_(1.0)
        torch.ones(256, 256) @ torch.ones(256, 256)
