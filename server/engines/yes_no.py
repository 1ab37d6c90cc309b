"""A yes/no answer read from the next token's distribution: what ``Engine.check`` returns.

A check's probability is P(yes) / (P(yes) + P(no)) at the first assistant position, where
P(yes) is the probability of the tokens whose text, stripped and lower-cased, is one of
``YES_WORDS`` (" Yes", "yes", "YES", ...) and P(no) the same for ``NO_WORDS``. A model that
gives both next to nothing (together under ``MIN_ANSWER_MASS``) would answer neither, so the
check says 0.5: it does not know.

Engines that hold the tokenizer find the token ids once (``answer_token_ids``); a remote engine
sees token strings only and sorts them with ``answer_kind``. Engines that serve many requests
at once run a call's prompts together (``check_concurrently``). Nothing here needs torch.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import anyio

from server.engines.base import NO_WORDS, YES_WORDS, CheckResult, EngineError, Prompt

#: Below this much probability for yes and no together, the check's answer is 0.5.
MIN_ANSWER_MASS = 1e-6


def answer_kind(token_text: str) -> Literal["yes", "no"] | None:
    """Whether a token's text is a yes word, a no word or neither (case and spaces aside)."""
    word = token_text.strip().lower()
    if word in YES_WORDS:
        return "yes"
    if word in NO_WORDS:
        return "no"
    return None


def answer_token_ids(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids of ``tokenizer``'s yes tokens and of its no tokens (special tokens never count).

    Every id is decoded once, so call it once per engine: a 150k vocabulary takes a second.
    """
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    yes: list[int] = []
    no: list[int] = []
    for token_id, text in enumerate(texts):
        kind = answer_kind(text) if token_id not in special else None
        if kind == "yes":
            yes.append(token_id)
        elif kind == "no":
            no.append(token_id)
    return tuple(yes), tuple(no)


def yes_probability(yes_mass: float, no_mass: float) -> float:
    """P(yes) / (P(yes) + P(no)) from the two masses; 0.5 when both are next to nothing."""
    total = yes_mass + no_mass
    if not total >= MIN_ANSWER_MASS:  # also NaN
        return 0.5
    return min(1.0, max(0.0, yes_mass / total))


def yes_probability_of_logprobs(yes: Iterable[float], no: Iterable[float]) -> float:
    """``yes_probability`` from the log probabilities of the yes tokens and of the no tokens seen."""
    return yes_probability(sum(math.exp(lp) for lp in yes), sum(math.exp(lp) for lp in no))


async def check_concurrently(
    prompts: list[Prompt], check_one: Callable[[int, Prompt], Awaitable[CheckResult]]
) -> list[CheckResult]:
    """``check_one(index, prompt)`` for every prompt at once, in one task group; the results in
    the prompts' order. When one fails the others are cancelled and its error is raised (the
    first ``EngineError`` when several failed), not an exception group."""
    results: list[CheckResult | None] = [None] * len(prompts)

    async def run(index: int, prompt: Prompt) -> None:
        results[index] = await check_one(index, prompt)

    try:
        async with anyio.create_task_group() as group:
            for index, prompt in enumerate(prompts):
                group.start_soon(run, index, prompt)
    except BaseExceptionGroup as failed:
        errors = _leaves(failed)
        raise next((e for e in errors if isinstance(e, EngineError)), errors[0]) from failed
    return [result for result in results if result is not None]


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found
