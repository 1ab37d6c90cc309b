"""The server folder's fixture: what the shared server's engine encodes during a test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.socket.server.encoded_prompts import Encoded, EncodedPrompts

if TYPE_CHECKING:
    from server.background import RunningServer
    from server.engines.base import Prompt


@pytest.fixture
def encoded_prompts(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[EncodedPrompts]:
    """The prompts the shared server's transformers engine encodes during the test."""
    encoder = server.engine.encoder
    original = encoder.encode
    prompts = EncodedPrompts(encoder, original)

    def recording(prompt: Prompt) -> list[Any]:
        pieces = original(prompt)
        ids = tuple(i for p in pieces if p.image_key is None for i in p.ids)
        prompts.seen.append(Encoded(prompt, ids, lambda i: encoder.tokenizer.decode(i, skip_special_tokens=False)))
        return pieces

    monkeypatch.setattr(encoder, "encode", recording)
    yield prompts
