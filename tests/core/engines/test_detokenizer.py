"""IncrementalDetokenizer against two tokenizers trained here on a small corpus.

- byte-level BPE (GPT-2 / Qwen style): multi-byte characters the corpus did not teach
  it are split into single-byte tokens, and some learned tokens end mid-character;
- SentencePiece-style BPE (Llama / Mistral style): Metaspace "▁word" pieces, with byte
  fallback tokens ``<0xNN>`` for characters outside its alphabet.
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from server.engines.detokenizer import MAX_HELD_TOKENS, IncrementalDetokenizer

CORPUS = (
    ["The quick brown fox jumps over the lazy dog."] * 20
    + ["go日本 so東京 no本"] * 10
    + ["Ça coûte 5 €, très cher!"] * 5
    + ["日本語のテキストです。"] * 3
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# Random answers draw from ASCII, accents, CJK the tokenizers know and CJK and emoji
# they do not (split into several byte tokens), including a skin-tone modifier and a ZWJ.
ALPHABET = list("abcdefghij XYZ.,!?'\n\t") + list("éüçß€日本語東京猫犬") + [
    "😀",
    "👍🏽",
    "👩‍💻",
    "🇫🇷",
    "∑",
]


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Return a byte-level BPE tokenizer (ByteLevel pre-tokenizer and decoder)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """Return a Metaspace BPE tokenizer with ``<0xNN>`` byte fallback."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    trained.train_from_iterator(CORPUS, trainer)
    # The trainer cannot add byte tokens, so the model is rebuilt with them in its vocab.
    vocab, merges = _vocab_and_merges(trained)
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")]
    )
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def _vocab_and_merges(
    tokenizer: Tokenizer,
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Return a trained BPE model's vocabulary and merges."""
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return dict(model["vocab"]), merges


@pytest.fixture(scope="module")
def byte_level() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def sentencepiece() -> PreTrainedTokenizerFast:
    return sentencepiece_tokenizer()


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def any_tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return request.getfixturevalue(request.param)


def stream(
    tokenizer: PreTrainedTokenizerFast, ids: list[int], skip_special_tokens: bool = True
) -> tuple[list[str], str]:
    """Push ``ids`` one by one; return what each push emitted and what flush emitted."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    tail = detokenizer.flush()
    assert detokenizer.text == "".join(pieces) + tail
    return pieces, tail


def test_character_split_across_tokens_is_emitted_whole(byte_level):
    """A CJK character whose bytes span tokens comes out whole, with the first token."""
    ids = byte_level.encode("東京")
    assert [byte_level.decode([i]) for i in ids] == ["\ufffd", "\ufffd" * 3, "\ufffd" * 2]
    pieces, tail = stream(byte_level, ids)
    assert pieces == ["", "東", "京"]
    assert tail == ""


def test_only_the_incomplete_tail_is_held_back(byte_level):
    """A token decoding to complete text plus half a character emits the complete text."""
    ids = byte_level.encode("no本")
    assert byte_level.decode(ids[:1]) == "no\ufffd"
    pieces, _ = stream(byte_level, ids)
    assert pieces == ["no", "本"]


@pytest.mark.parametrize(
    "text",
    ["go日本 語 so東京 no本 猫犬", "ok 😀 👍🏽 👩‍💻 🇫🇷 done", "Ça coûte 5 €, très cher!"],
)
def test_multibyte_text_streams_without_broken_characters(any_tokenizer, text):
    """No emitted piece holds U+FFFD, and the pieces add up to decode(ids)."""
    ids = any_tokenizer.encode(text)
    pieces, tail = stream(any_tokenizer, ids)
    assert not any("\ufffd" in piece for piece in pieces + [tail])
    assert "".join(pieces) + tail == any_tokenizer.decode(ids) == text


def test_emoji_bytes_are_held_until_complete(any_tokenizer):
    """An emoji spread over four byte tokens appears with its fourth token, not before."""
    ids = any_tokenizer.encode("x😀")
    emoji_ids = ids[-4:]
    assert len({any_tokenizer.decode([i]) for i in emoji_ids}) == 1  # four lone bytes
    pieces, tail = stream(any_tokenizer, ids)
    assert pieces[-4:] == ["", "", "", "😀"]
    assert tail == ""


def test_sentencepiece_words_keep_their_leading_spaces(sentencepiece):
    """Each "▁word" token streams with its space, though decoding it alone drops it."""
    ids = sentencepiece.encode("The quick brown fox jumps")
    assert [sentencepiece.decode([i]) for i in ids] == ["The", "quick", "brown", "fox", "jumps"]
    pieces, _ = stream(sentencepiece, ids)
    assert pieces == ["The", " quick", " brown", " fox", " jumps"]


def test_sentencepiece_spaces_survive_a_long_answer(sentencepiece):
    """Spaces stay right after the decode window has been cut back many times."""
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    ids = sentencepiece.encode(text)
    pieces, tail = stream(sentencepiece, ids)
    assert "".join(pieces) + tail == text


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_follow_skip_special_tokens(any_tokenizer, skip):
    """Special tokens vanish when skipped and appear verbatim when not."""
    ids = [any_tokenizer.bos_token_id, *any_tokenizer.encode("The dog"), any_tokenizer.eos_token_id]
    pieces, tail = stream(any_tokenizer, ids, skip_special_tokens=skip)
    streamed = "".join(pieces) + tail
    assert streamed == any_tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("</s>" in streamed) is not skip
    assert ("<s>" in streamed) is not skip


def test_byte_level_invalid_byte_flows_through(byte_level):
    """A stray 0xFF byte becomes U+FFFD, emitted as soon as text follows it."""
    ids = [byte_level.convert_tokens_to_ids("ÿ"), *byte_level.encode(" fox jumps")]
    pieces, tail = stream(byte_level, ids)
    assert pieces[:3] == ["", "\ufffd fox", " jumps"]
    assert tail == ""
    assert "".join(pieces) == byte_level.decode(ids)


def test_byte_fallback_invalid_byte_flows_through(sentencepiece):
    """A stray <0xFF> token becomes U+FFFD, emitted as soon as text follows it."""
    ids = [*sentencepiece.encode("The"), sentencepiece.convert_tokens_to_ids("<0xFF>")]
    ids += sentencepiece.encode("fox jumps")
    pieces, tail = stream(sentencepiece, ids)
    assert pieces == ["The", "", "\ufffd fox", " jumps"]
    assert tail == ""
    assert "".join(pieces) == sentencepiece.decode(ids)


def test_invalid_bytes_are_not_held_forever(byte_level):
    """A run of bytes that never completes a character is released after a few tokens."""
    lead_byte = byte_level.convert_tokens_to_ids("æ")  # 0xE6 starts a 3-byte character
    detokenizer = IncrementalDetokenizer(byte_level)
    pieces = [detokenizer.push(lead_byte) for _ in range(MAX_HELD_TOKENS + 1)]
    assert pieces[:MAX_HELD_TOKENS] == [""] * MAX_HELD_TOKENS
    assert pieces[MAX_HELD_TOKENS] == "\ufffd" * (MAX_HELD_TOKENS + 1)
    assert detokenizer.push(byte_level.convert_tokens_to_ids("Ġfox")) == " fox"


def test_flush_emits_the_held_back_tail(byte_level):
    """An answer cut off mid-character ends with U+FFFD from flush, as decode shows it."""
    ids = byte_level.encode("go 東")[:-1]
    pieces, tail = stream(byte_level, ids)
    assert "".join(pieces) == "go "
    assert tail == "\ufffd"
    assert "".join(pieces) + tail == byte_level.decode(ids)


def test_text_is_everything_emitted_so_far(byte_level):
    """``text`` grows with each push and includes what flush emitted."""
    detokenizer = IncrementalDetokenizer(byte_level)
    ids = byte_level.encode("The 東")
    for count, token_id in enumerate(ids, start=1):
        detokenizer.push(token_id)
        assert detokenizer.text == byte_level.decode(ids[:count]).rstrip("\ufffd")
    detokenizer.flush()
    assert detokenizer.text == byte_level.decode(ids)


def test_each_push_decodes_a_bounded_window(byte_level, monkeypatch):
    """Per-token work stays bounded: no push re-decodes the whole answer."""
    decoded_lengths: list[int] = []
    decode = byte_level.decode

    def recording_decode(ids, **kwargs):
        decoded_lengths.append(len(ids))
        return decode(ids, **kwargs)

    monkeypatch.setattr(byte_level, "decode", recording_decode)
    text = "The quick brown fox 日本語 😀 jumps. " * 50
    ids = byte_level.encode(text)
    pieces, tail = stream(byte_level, ids)
    monkeypatch.undo()
    assert "".join(pieces) + tail == text
    assert len(ids) > 500
    assert max(decoded_lengths) <= 32
    assert len(decoded_lengths) <= 2 * len(ids)


def test_random_answers_round_trip(any_tokenizer):
    """For random text, the pieces never hold U+FFFD and add up to decode(ids)."""
    rng = random.Random(1234)
    for _ in range(150):
        text = "".join(rng.choices(ALPHABET, k=rng.randint(1, 80)))
        ids = any_tokenizer.encode(text)
        pieces, tail = stream(any_tokenizer, ids)
        assert not any("\ufffd" in piece for piece in pieces + [tail]), text
        assert "".join(pieces) + tail == any_tokenizer.decode(ids), text
