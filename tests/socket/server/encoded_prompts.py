"""What the shared server's engine reads: each prompt the transformers engine encodes, recorded
on its way to the model (the chat template applied, user text escaped), for tests that must
show a client's text reached the model as they claim (fixture ``encoded_prompts``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.engines.base import ChatTurn, Prompt, TextSegment


@dataclass(frozen=True)
class Encoded:
    """One prompt as the engine encoded it: the conversation, and the token ids of its text runs."""

    prompt: Prompt
    text_ids: tuple[int, ...]
    decode: Callable[[list[int]], str]

    @property
    def text(self) -> str:
        """What the model reads besides the images, special tokens included."""
        return self.decode(list(self.text_ids))

    def turn_texts(self, role: str) -> list[str]:
        """The plain text of each of the conversation's turns of ``role``."""
        return ["".join(s.text for s in t.segments if isinstance(s, TextSegment)) for t in self.prompt.turns if t.role == role]


class EncodedPrompts:
    """Every prompt the engine encoded while the fixture was in use, oldest first."""

    def __init__(self, encoder: Any, encode: Callable[[Prompt], list[Any]]) -> None:
        self.encoder, self._encode = encoder, encode
        self.seen: list[Encoded] = []

    def holding(self, marker: str) -> list[Encoded]:
        """The prompts whose text holds ``marker`` (a test's own words: other sessions' warmups
        may encode prompts of their own at the same time)."""
        return [e for e in self.seen if any(marker in text for role in ("system", "user") for text in e.turn_texts(role))]

    def special_ids(self, prompt: Prompt) -> list[int]:
        """The special-token ids in the text runs ``prompt`` encodes to, in order."""
        specials = set(self.encoder.tokenizer.all_special_ids) | {
            self.encoder.tokenizer.convert_tokens_to_ids(t) for t in self.encoder.specials
        }
        return [i for p in self._encode(prompt) if p.image_key is None for i in p.ids if i in specials]


def with_text(prompt: Prompt, old: str, new: str) -> Prompt:
    """``prompt`` with ``old`` replaced by ``new`` in every text segment."""
    turns = tuple(
        ChatTurn(t.role, tuple(TextSegment(s.text.replace(old, new)) if isinstance(s, TextSegment) else s for s in t.segments))
        for t in prompt.turns
    )
    return dataclasses.replace(prompt, turns=turns)
