"""Turning a stream of generated token ids into a stream of text deltas.

Decoding each token on its own goes wrong in two ways. A byte-level BPE token (or a
SentencePiece byte-fallback token) can end in the middle of a multi-byte UTF-8 character,
which ``decode`` shows as U+FFFD; and a SentencePiece-style (Metaspace) decoder drops the
leading space of the first token it is given, so "▁world" alone decodes to "world".

``IncrementalDetokenizer`` decodes a short window of recent tokens and emits how far that
text has grown since the last push. A trailing run of U+FFFD is held back until the
character completes; an U+FFFD with text after it is a real decoding error and flows
through. The window is cut back every few tokens, so a push costs the same at token 10
and at token 10,000.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHARACTER = "\ufffd"

# A UTF-8 character is at most four bytes, and every byte-level or byte-fallback token
# carries at least one, so a real character completes within four tokens. Text still
# held after more pushes than this is invalid bytes, and it is emitted as U+FFFD.
MAX_HELD_TOKENS = 4

# Tokens kept in front of the newest ones when the window is cut back: a Metaspace
# "▁word" keeps its space only when some token comes before it in the window.
_CONTEXT_TOKENS = 4
# The window is cut back once it holds this many tokens: the cut costs a few decodes,
# paid once every dozen tokens rather than on every push.
_WINDOW_TOKENS = 16
# If no clean cut point is found (a long stretch of invalid bytes), the window is cut
# anyway at this length so that it stays bounded.
_MAX_WINDOW_TOKENS = 64


class IncrementalDetokenizer:
    """Turns one answer's token ids, pushed one at a time, into text deltas.

    For text the tokenizer decodes without errors, everything ``push`` returned plus
    ``flush`` equals ``tokenizer.decode(all_ids, skip_special_tokens=...)``, and no
    piece contains a broken character.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Recent token ids, what they decode to, and how many characters of that
        # decoded text have been emitted; the rest is held back.
        self._window: list[int] = []
        self._window_text = ""
        self._window_emitted = 0
        # Consecutive pushes after which text was still held back.
        self._held_pushes = 0
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """Return everything emitted so far by ``push`` and ``flush``."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def push(self, token_id: int) -> str:
        """Add one generated token.

        Returns the text that became safe to show with this token, possibly "": a
        character split across tokens is held back until its last byte arrives (or, for
        invalid bytes, until ``MAX_HELD_TOKENS`` pushes have passed).
        """
        self._window.append(token_id)
        self._window_text = self._decode(self._window)
        safe_end = len(self._window_text.rstrip(REPLACEMENT_CHARACTER))
        if safe_end < len(self._window_text):
            self._held_pushes += 1
            if self._held_pushes > MAX_HELD_TOKENS:
                safe_end = len(self._window_text)
        return self._emit_until(safe_end)

    def flush(self) -> str:
        """Return the text still held back at the end of the answer, possibly "".

        An unfinished character comes out as U+FFFD, as ``decode`` would show it.
        """
        return self._emit_until(len(self._window_text))

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _emit_until(self, end: int) -> str:
        """Emit the window's text up to ``end``; returns the new part."""
        text = self._window_text
        piece = text[self._window_emitted : end]
        # The text can only shrink below what was emitted after held bytes were forced
        # out and then completed a character; counting from the shorter text then keeps
        # the next pieces from skipping characters.
        self._window_emitted = min(max(self._window_emitted, end), len(text))
        if self._window_emitted == len(text):
            self._held_pushes = 0
            if len(self._window) >= _WINDOW_TOKENS:
                self._cut_window()
        if piece:
            self._pieces.append(piece)
        return piece

    def _cut_window(self) -> None:
        """Drop old tokens, keeping a few as context; called when nothing is held back.

        A cut point is clean when the kept tokens decode to the end of the current text:
        cutting inside a character (byte-level BPE) or inside a run of byte-fallback
        tokens would turn the kept bytes into U+FFFD.
        """
        newest_cut = len(self._window) - _CONTEXT_TOKENS
        for cut in range(newest_cut, max(newest_cut - _CONTEXT_TOKENS, 0), -1):
            kept_text = self._decode(self._window[cut:])
            if self._window_text.endswith(kept_text):
                self._keep_from(cut, kept_text)
                return
        if len(self._window) >= _MAX_WINDOW_TOKENS:
            self._keep_from(newest_cut, self._decode(self._window[newest_cut:]))

    def _keep_from(self, cut: int, kept_text: str) -> None:
        self._window = self._window[cut:]
        self._window_text = kept_text
        self._window_emitted = len(kept_text)
