"""Turning a ``Prompt`` into model inputs, piece by piece.

The chat template renders the conversation once; the rendered text is split at the image
placeholders, every text piece is tokenized alone and every image is expanded by the
model's processor. Because pieces are tokenized independently, a prompt that extends
another (more frames, then a question) yields a token sequence that extends the other's:
that is what lets a KV cache be reused.

User text never becomes a control token. Every ``TextSegment`` (system prompt, questions,
transcripts, answers in the history, timestamps) reaches the template as a placeholder, so
the template's own markers are the only markup in the rendered text, and goes in with every
special token's text broken by a zero-width space (``escape_special``): ``<|im_end|>`` or
``<|image_pad|>`` typed by a user is plain characters to the tokenizer, and the prompt's
image placeholders are exactly the template's. (Escaping rather than tokenizing user text
alone keeps the tokens of ordinary text identical to a whole-prompt tokenization.)

Positions are computed here too. Plain decoders use 0..n-1. The Qwen2-VL family uses
multimodal rotary positions (three rows: time, height, width): text advances all three
rows together; an image's tokens take their grid coordinates offset by the position at
which the image starts, and the text after it resumes at one past the largest.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import re

import torch

from server.engines.base import AudioSegment, ImageSegment, Prompt, TextSegment, processor_image

V = TypeVar("V")
_CUT = "\u0000livesight-cut\u0000"
_TEXT = re.compile("\u0000livesight-text-([0-9]+)\u0000")
_BREAK = "\u200b"  # zero width space: splits a special token's text without a visible change


@dataclass(frozen=True, slots=True)
class UserText:
    """A run of the rendered prompt that came from a ``TextSegment``: never markup."""

    text: str


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of prompt tokens. Image pieces are atomic (a cache may end before or after
    one, never inside it) and keep their source image, so their pixel inputs can be
    computed again when they are no longer cached."""

    ids: tuple[int, ...]
    image_key: str | None = None
    grid: tuple[int, int, int] | None = None  # (t, h, w) in language-model tokens
    source: ImageSegment | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ImageFamily:
    """How one model family marks images in its chat template."""

    placeholder: str  # what the template renders for one image
    processor_text: str  # what to hand the processor so it expands one image
    mrope: bool


FAMILIES = {
    "qwen2_vl": ImageFamily("<|image_pad|>", "<|image_pad|>", mrope=True),
    "plain": ImageFamily("<image>", "<image>", mrope=False),
}


def special_tokens(tokenizer: Any) -> list[str]:
    """The text of every special token of ``tokenizer`` (named and added ones), longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if t), key=len, reverse=True)


def escape_special(text: str, specials: list[str]) -> str:
    """``text`` with every occurrence of a special token's text broken after its first
    character by a zero-width space, so no tokenizer reads it as that token."""
    for token in specials:
        if token in text:  # a one-character token cannot be broken: it is replaced
            text = text.replace(token, token[0] + _BREAK + token[1:] if len(token) > 1 else "\ufffd")
    return text


def render_chat(
    template_owner: Any, prompt: Prompt, specials: list[str] | None = None, templates: _Lru[str] | None = None
) -> tuple[str, list[ImageSegment]]:
    """Render ``prompt`` with ``template_owner.apply_chat_template`` (a processor or tokenizer).

    Returns the text, with the model's own image placeholders, and the prompt's images in
    order; user text is escaped with ``escape_special`` (``specials``: default, the
    tokenizer's special tokens). An open turn is cut right after its last segment, with no
    end of turn and no generation prompt, so its text is a prefix of any prompt that
    continues it. Audio segments are left out (no engine here takes audio input yet).
    ``templates``: see ``render_runs``.
    """
    if specials is None:
        specials = special_tokens(getattr(template_owner, "tokenizer", template_owner))
    runs, images = render_runs(template_owner, prompt, templates)
    text = "".join(escape_special(r.text, specials) if isinstance(r, UserText) else r for r in runs)
    return text, images


def render_runs(
    template_owner: Any, prompt: Prompt, templates: _Lru[str] | None = None
) -> tuple[list[str | UserText], list[ImageSegment]]:
    """Render ``prompt`` as runs of template markup (``str``, with the image placeholders)
    and ``UserText``, and the prompt's images in order. See ``render_chat``.

    The template sees only the prompt's shape (roles, and where texts and images go: texts
    reach it as numbered placeholders), so ``templates`` may keep its output by shape: a
    session's next prompts mostly have the shape of an earlier one."""
    shape = (prompt.open_turn, tuple((t.role, tuple(type(seg) for seg in t.segments)) for t in prompt.turns))
    rendered = templates.get(shape) if templates is not None else None
    texts = [seg.text for turn in prompt.turns for seg in turn.segments if isinstance(seg, TextSegment)]
    images = [seg for turn in prompt.turns for seg in turn.segments if isinstance(seg, ImageSegment)]
    if rendered is None:
        rendered = _render_template(template_owner, prompt)
        if templates is not None:
            templates.put(shape, rendered)
    runs: list[str | UserText] = []
    for i, part in enumerate(_TEXT.split(rendered)):
        if i % 2:
            if texts[int(part)]:
                runs.append(UserText(texts[int(part)]))
        elif part:
            runs.append(part)
    return runs, images


def _render_template(template_owner: Any, prompt: Prompt) -> str:
    """The chat template's output for ``prompt``, each text a numbered placeholder."""
    messages, count = [], 0
    for index, turn in enumerate(prompt.turns):
        parts: list[dict[str, str]] = []
        for seg in turn.segments:
            if isinstance(seg, TextSegment):
                parts.append({"type": "text", "text": f"\u0000livesight-text-{count}\u0000"})
                count += 1
            elif isinstance(seg, ImageSegment):
                parts.append({"type": "image"})
            elif isinstance(seg, AudioSegment):
                continue
        if prompt.open_turn and index == len(prompt.turns) - 1:
            parts.append({"type": "text", "text": _CUT})
        messages.append({"role": turn.role, "content": parts})
    text = template_owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=not prompt.open_turn)
    return text[: text.index(_CUT)] if prompt.open_turn else text


class PromptEncoder:
    """Renders prompts with the model's chat template and encodes them into pieces."""

    def __init__(self, processor: Any, family: str, max_cached_images: int = 128) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.specials = special_tokens(self.tokenizer)
        self.family = FAMILIES[family]
        self.merge = int(getattr(processor.image_processor, "merge_size", 1) or 1)
        # An image's token layout is small and needed by every query over it; its pixel
        # inputs are large and needed only when it is (re)computed into a KV cache.
        self._layouts: _Lru[Piece] = _Lru(16 * max_cached_images)
        self._pixels: _Lru[dict[str, torch.Tensor]] = _Lru(max_cached_images)
        self._texts: _Lru[Piece] = _Lru(64 * max_cached_images)
        self._templates: _Lru[str] = _Lru(max_cached_images)

    # ------------------------------------------------------------------ rendering
    def render(self, prompt: Prompt) -> list[str | ImageSegment]:
        """Return the prompt as text runs and images, in order."""
        text, images = render_chat(self.processor, prompt, self.specials, self._templates)
        chunks = text.split(self.family.placeholder)
        if len(chunks) != len(images) + 1:
            raise ValueError("the chat template did not render one placeholder per image")
        out: list[str | ImageSegment] = []
        for chunk, image in zip(chunks, images + [None]):
            if chunk:
                out.append(chunk)
            if image is not None:
                out.append(image)
        return out

    # ------------------------------------------------------------------ encoding
    def encode(self, prompt: Prompt) -> list[Piece]:
        """Return the prompt's pieces (text runs and images)."""
        pieces = []
        for item in self.render(prompt):
            if isinstance(item, str):
                pieces.append(self.text_piece(item))
            else:
                pieces.append(self.image_piece(item))
        return pieces

    def text_piece(self, text: str) -> Piece:
        """The tokens of one text run, cached: most runs (timestamps, turns) recur every query."""
        cached = self._texts.get(text)
        if cached is None:
            cached = Piece(tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
            self._texts.put(text, cached)
        return cached

    def image_piece(self, image: ImageSegment) -> Piece:
        """The tokens of one image (its layout is cached by content key)."""
        cached = self._layouts.get(image.key)
        if cached is not None:
            return Piece(cached.ids, image.key, cached.grid, image)
        return self._process(image)

    def knows(self, image: ImageSegment) -> bool:
        """True when the image's token layout is cached (encoding it again costs nothing)."""
        return self._layouts.get(image.key) is not None

    def pixel_inputs(self, piece: Piece) -> dict[str, torch.Tensor]:
        """The processor's pixel inputs for an image piece (cached, else computed again)."""
        inputs = self._pixels.get(piece.image_key)
        if inputs is None:
            if piece.source is None:
                raise ValueError("an image piece without its source image")
            self._process(piece.source)
            inputs = self._pixels.get(piece.image_key)
        return inputs

    def _process(self, image: ImageSegment) -> Piece:
        pixels = processor_image(image.pixels())
        out = self.processor(
            text=[self.family.processor_text],
            images=[[pixels]] if not self.family.mrope else [pixels],
            return_tensors="pt",
            add_special_tokens=False,
        )
        ids = tuple(int(i) for i in out["input_ids"][0])
        inputs = {k: v for k, v in out.items() if k not in {"input_ids", "attention_mask", "mm_token_type_ids"}}
        grid = None
        if "image_grid_thw" in out:
            t, h, w = (int(v) for v in out["image_grid_thw"][0])
            grid = (t, h // self.merge, w // self.merge)
        piece = Piece(ids, image.key, grid, image)
        self._layouts.put(image.key, Piece(ids, image.key, grid))
        self._pixels.put(image.key, inputs)
        return piece

    # ------------------------------------------------------------------ usage
    @property
    def image_token_id(self) -> int | None:
        """The token an image placeholder expands to (repeated once per image token)."""
        token = getattr(self.processor, "image_token_id", None)
        if token is None:
            token = self.tokenizer.convert_tokens_to_ids(self.family.placeholder)
        return None if token is None else int(token)

    def image_tokens(self, pieces: list[Piece]) -> int:
        """How many of ``pieces``' tokens are image tokens (the processor's image token id)."""
        token = self.image_token_id
        return sum(p.ids.count(token) for p in pieces if p.image_key is not None)

    def text_tokens(self, text: str) -> int:
        """The length of ``text`` tokenized alone (0 for no text)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    # ------------------------------------------------------------------ positions
    def position_ids(self, pieces: list[Piece], start: int) -> tuple[torch.Tensor, int]:
        """Position ids for ``pieces`` placed after a cache whose next position is ``start``.

        Returns ``(position_ids, next_position)``; ``position_ids`` is (3, 1, n) for mrope
        models and (1, n) otherwise.
        """
        if not self.family.mrope:
            n = sum(len(p.ids) for p in pieces)
            return torch.arange(start, start + n).unsqueeze(0), start + n
        rows: list[torch.Tensor] = []
        pos = start
        image_token = self.processor.image_token_id
        for piece in pieces:
            if piece.grid is None:
                n = len(piece.ids)
                rows.append(torch.arange(pos, pos + n).expand(3, n))
                pos += n
                continue
            # text tokens around the image pads (vision_start/end) advance as text
            ids = torch.tensor(piece.ids)
            is_pad = ids == image_token
            col = torch.empty(3, len(piece.ids), dtype=torch.long)
            t, h, w = piece.grid
            grid = torch.stack(
                torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
            ).reshape(3, -1)
            k = 0
            pad_positions = torch.nonzero(is_pad).flatten()
            if len(pad_positions) != t * h * w:
                raise ValueError("image token count does not match its grid")
            while k < len(piece.ids) and not is_pad[k]:
                col[:, k] = pos
                pos += 1
                k += 1
            col[:, k : k + t * h * w] = grid + pos
            pos = int(col[:, k : k + t * h * w].max()) + 1
            k += t * h * w
            while k < len(piece.ids):
                col[:, k] = pos
                pos += 1
                k += 1
            rows.append(col)
        if not rows:
            return torch.empty(3, 1, 0, dtype=torch.long), start
        return torch.cat(rows, dim=1).unsqueeze(1), pos


class _Lru(Generic[V]):
    """A dict bounded to ``size`` entries, dropping the least recently used."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str | None) -> V | None:
        item = self._items.get(key) if key is not None else None
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
