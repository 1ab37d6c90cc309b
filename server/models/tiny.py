"""Tiny random-weight image-text models, generated locally for demos and tests.

``make_tiny_model`` writes a complete model directory: float32 safetensors weights, a
byte-level BPE tokenizer trained here on a small corpus, a chat template, the image
processor config and ``livesight_demo.json``, the marker that says the answers are noise.
Nothing is downloaded; nothing needs torchvision.

Two families:

- ``qwen2_5_vl``: Qwen2.5-VL (multimodal rotary positions), ``Qwen2VLImageProcessorPil``
  sized so a 320x240 frame gives 99 image tokens and no frame more than 256.
- ``idefics3``: SmolVLM's family (SigLIP-like vision + Llama text),
  ``Idefics3ImageProcessorPil`` at 256 px without splitting: 256 image tokens per frame.

``init_std`` sets the initializer range of the text and vision towers. A large value
(e.g. 0.3) gives a "sharp" model whose greedy tokens change when positions or caches are
wrong; the default init makes logits so flat that such mistakes can go unnoticed.

``build_tiny_model``, ``save_tiny_model`` and ``write_marker`` are the steps of
``make_tiny_model``, for models built at another ``TinyShape`` and trained before they are
saved (``colours``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3Processor,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

FAMILIES = ("qwen2_5_vl", "idefics3")
DEMO_MARKER = "livesight_demo.json"

MAX_POSITIONS = 8192

# Qwen2.5-VL: 14 px patches merged 2x2, so one image token covers 28x28 pixels.
QWEN_PATCH = 14
QWEN_MERGE = 2
QWEN_PIXELS_PER_TOKEN = (QWEN_PATCH * QWEN_MERGE) ** 2


@dataclass(frozen=True)
class TinyShape:
    """Every size of a generated model. The defaults are the random demo model's:
    ``qwen_max_tokens`` bounds a Qwen frame's image tokens (a 320x240 frame gives 99 at 256),
    ``idefics3_image`` is the side an Idefics3 frame is resized to (256 px in 8 px patches,
    pixel-shuffled by 2: 256 tokens)."""

    vocab: int = 800
    text_hidden: int = 128
    text_heads: int = 2
    text_intermediate: int = 256
    text_layers: int = 2
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_layers: int = 2
    vision_heads: int = 2
    qwen_min_tokens: int = 4
    qwen_max_tokens: int = 256
    idefics3_image: int = 256
    idefics3_patch: int = 8
    idefics3_scale: int = 2

    @property
    def head_dim(self) -> int:
        return self.text_hidden // self.text_heads

    @property
    def idefics3_image_seq_len(self) -> int:
        """Image tokens per Idefics3 frame: patches per image over the pixel-shuffle area."""
        return (self.idefics3_image // self.idefics3_patch) ** 2 // self.idefics3_scale**2


RANDOM_SHAPE = TinyShape()

_WORDS = """
the a an and or but if then so because of in on at to from with without by for about over under
near far left right up down front back top bottom middle inside outside between behind above below
is are was were be been being has have had do does did can could will would should may might must
i you he she it we they me him her us them my your his its our their this that these those here there
what which who whom whose when where why how yes no not all any some many much more most few less
one two three four five six seven eight nine ten first second third last next other same different
cat dog bird fish horse cow person man woman child people face hand hands eye eyes hair head arm leg
car bus bike train plane boat road street house room door window wall floor table chair desk bed cup
glass bottle book phone screen laptop keyboard mouse camera lamp light shadow sky cloud sun tree grass
flower water river sea mountain hill city park garden kitchen office shop box bag ball toy shirt hat
red green blue yellow orange purple pink black white gray brown dark bright big small large tiny tall
short long wide narrow round square flat open closed full empty new old young happy sad busy quiet
see look looks watch show shows hold holds holding sit sits sitting stand stands standing walk walks
walking run runs running move moves moving turn turns wave waves waving smile smiles talk talks wear
image picture photo frame video camera scene view color colour shape object thing things part side
describe answer question tell explain count read write find notice appear appears seems seem
user assistant system helpful brief clear short sentence word words text time second seconds now
before after during while again still just only also very really quite almost about around
""".split()

# Rare multi-byte words: kept in the corpus so the byte alphabet covers them, rare enough that
# BPE does not merge them whole, so their characters are split across byte tokens.
_MULTIBYTE = ["café", "naïve", "über", "señor", "crème", "日本語", "東京", "😀", "👍", "€5", "Ωmega"]
_CORPUS_SENTENCES = 4000
_MULTIBYTE_RATE = 0.05  # fraction of sentences with one multi-byte word


@dataclass(frozen=True)
class _Family:
    """What differs between families: tokens, template and how the model is built."""

    special_tokens: list[str]
    bos: str
    eos: str
    pad: str
    chat_template: str
    build: Callable[[PreTrainedTokenizerFast, TinyShape, float | None], PreTrainedModel]
    save_processor: Callable[[PreTrainedTokenizerFast, Path, TinyShape], None]


_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url', 'image_pil') %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# SmolVLM style: "<|im_start|>User:<image>What is this?<end_of_utterance>\nAssistant:"
_IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}"
    "{% else %}{% if message['content'] and message['content'][0]['type'] in "
    "('image', 'image_url', 'image_pil') %}:{% else %}: {% endif %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url', 'image_pil') %}<image>"
    "{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def make_tiny_model(
    out_dir: Path, family: str = "qwen2_5_vl", init_std: float | None = None, seed: int = 0
) -> Path:
    """Write a tiny random-weight image-text model of ``family`` into ``out_dir``.

    The directory loads with ``AutoModelForImageTextToText.from_pretrained``,
    ``AutoTokenizer.from_pretrained`` and ``server.engines.hf_loading.load_processor``.
    ``init_std`` overrides the initializer range (default: the family's own, 0.02);
    ``seed`` makes the corpus and the weights reproducible.

    Returns the directory path. Raises ``ValueError`` for an unknown family or a
    non-positive ``init_std``, and ``RuntimeError`` if transformers ignored ``init_std``.
    """
    model, tokenizer = build_tiny_model(family, RANDOM_SHAPE, init_std=init_std, seed=seed)
    out_dir = save_tiny_model(out_dir, family, model, tokenizer, RANDOM_SHAPE)
    write_marker(out_dir, {
        "random_weights": True,
        "family": family,
        "init_std": init_std,
        "seed": seed,
        "note": "Tiny random-weight model generated by livesight for demos and tests; its answers are noise.",
    })
    return out_dir


def build_tiny_model(
    family: str,
    shape: TinyShape,
    *,
    init_std: float | None = None,
    seed: int = 0,
    extra_sentences: tuple[str, ...] = (),
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Return a float32 model of ``family`` sized by ``shape`` in eval mode, with its tokenizer.

    The tokenizer is trained on the built-in corpus plus ``extra_sentences`` (words a task
    needs as single tokens). Raises as ``make_tiny_model``.
    """
    spec = _family_spec(family)
    if init_std is not None and init_std <= 0:
        raise ValueError(f"init_std must be positive, got {init_std}")
    tokenizer = _train_tokenizer(spec, shape, seed, extra_sentences)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.build(tokenizer, shape, init_std)
    _set_generation_tokens(model, tokenizer, spec)
    return model, tokenizer


def save_tiny_model(
    out_dir: Path, family: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, shape: TinyShape
) -> Path:
    """Write ``model``, ``tokenizer`` and the family's processor config into ``out_dir``; returns it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _family_spec(family).save_processor(tokenizer, out_dir, shape)
    return out_dir


def is_demo_model(model_dir: Path) -> bool:
    """Return True when ``model_dir`` holds a model written by ``make_tiny_model``."""
    return (Path(model_dir) / DEMO_MARKER).is_file()


def _family_spec(family: str) -> _Family:
    """Return the recipe for ``family``; raise ``ValueError`` for an unknown one."""
    if family == "qwen2_5_vl":
        return _Family(
            special_tokens=[
                "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
            ],
            bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>",
            chat_template=_QWEN_CHAT_TEMPLATE, build=_build_qwen2_5_vl, save_processor=_save_qwen_processor,
        )
    if family == "idefics3":
        grid_tokens = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        return _Family(
            special_tokens=[
                "<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<image>",
                "<fake_token_around_image>", "<global-img>", *grid_tokens,
            ],
            bos="<|im_start|>", eos="<end_of_utterance>", pad="<|endoftext|>",
            chat_template=_IDEFICS3_CHAT_TEMPLATE, build=_build_idefics3, save_processor=_save_idefics3_processor,
        )
    raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")


def _corpus(seed: int) -> list[str]:
    """Return English-like sentences with numbers and rare multi-byte words."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(_CORPUS_SENTENCES):
        words = rng.choices(_WORDS, k=rng.randint(3, 15))
        if rng.random() < _MULTIBYTE_RATE:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_MULTIBYTE))
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 999)))
        sentences.append(" ".join(words).capitalize() + rng.choice(".?!,"))
    return sentences


def _train_tokenizer(
    spec: _Family, shape: TinyShape, seed: int, extra_sentences: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """Return a byte-level BPE tokenizer trained on ``_corpus(seed)`` and ``extra_sentences``
    with the family's tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=spec.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed) + list(extra_sentences), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        model_max_length=MAX_POSITIONS,
        chat_template=spec.chat_template,
    )


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """Return the id of a special token that must exist in ``tokenizer``."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise RuntimeError(f"tokenizer lacks special token {token!r}")
    return token_id


def _text_config(tokenizer: PreTrainedTokenizerFast, shape: TinyShape, init_std: float | None) -> dict:
    """Return the text-tower settings shared by both families."""
    config = dict(
        vocab_size=len(tokenizer),
        hidden_size=shape.text_hidden,
        intermediate_size=shape.text_intermediate,
        num_hidden_layers=shape.text_layers,
        num_attention_heads=shape.text_heads,
        num_key_value_heads=1,
        head_dim=shape.head_dim,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return _with_init_std(config, init_std)


def _with_init_std(config: dict, init_std: float | None) -> dict:
    """Return ``config`` with ``initializer_range`` set when ``init_std`` is given."""
    return config if init_std is None else {**config, "initializer_range": init_std}


def _build_qwen2_5_vl(
    tokenizer: PreTrainedTokenizerFast, shape: TinyShape, init_std: float | None
) -> PreTrainedModel:
    """Return a float32 Qwen2.5-VL with random weights sized for ``tokenizer``."""
    half = shape.head_dim // 2  # mrope splits the rotary half-dimension into (time, height, width)
    text = _text_config(tokenizer, shape, init_std)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8],
    }
    vision = _with_init_std(
        dict(
            depth=shape.vision_layers, hidden_size=shape.vision_hidden,
            intermediate_size=shape.vision_intermediate, num_heads=shape.vision_heads,
            out_hidden_size=shape.text_hidden, patch_size=QWEN_PATCH, spatial_merge_size=QWEN_MERGE,
            temporal_patch_size=2, window_size=4 * QWEN_PATCH, fullatt_block_indexes=[shape.vision_layers - 1],
        ),
        init_std,
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=_token_id(tokenizer, "<|image_pad|>"),
        video_token_id=_token_id(tokenizer, "<|video_pad|>"),
        vision_start_token_id=_token_id(tokenizer, "<|vision_start|>"),
        vision_end_token_id=_token_id(tokenizer, "<|vision_end|>"),
        tie_word_embeddings=False,
    )
    return _instantiate(Qwen2_5_VLForConditionalGeneration, config, init_std)


def _build_idefics3(tokenizer: PreTrainedTokenizerFast, shape: TinyShape, init_std: float | None) -> PreTrainedModel:
    """Return a float32 Idefics3 (SigLIP-like vision + Llama text) with random weights."""
    text = {"model_type": "llama", **_text_config(tokenizer, shape, init_std)}
    vision = _with_init_std(
        dict(
            hidden_size=shape.vision_hidden, intermediate_size=shape.vision_intermediate,
            num_hidden_layers=shape.vision_layers, num_attention_heads=shape.vision_heads,
            image_size=shape.idefics3_image, patch_size=shape.idefics3_patch,
        ),
        init_std,
    )
    config = Idefics3Config(
        text_config=text,
        vision_config=vision,
        scale_factor=shape.idefics3_scale,
        image_token_id=_token_id(tokenizer, "<image>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return _instantiate(Idefics3ForConditionalGeneration, config, init_std)


def _instantiate(
    model_class: type[PreTrainedModel], config: PreTrainedConfig, init_std: float | None
) -> PreTrainedModel:
    """Return ``model_class(config)`` in float32 eval mode, checking ``init_std`` took effect.

    Raises ``RuntimeError`` if the language model head's weights do not have the
    requested spread (the init would then be silently ignored).
    """
    model = model_class(config).to(torch.float32).eval()
    if init_std is not None:
        _check_weight_std(model, init_std)
    return model


def _check_weight_std(model: PreTrainedModel, init_std: float) -> None:
    """Raise ``RuntimeError`` unless the text and vision weights have std near ``init_std``."""
    vision_weight = next(
        p for n, p in model.named_parameters() if ("visual" in n or "vision" in n) and p.dim() >= 2
    )
    for name, weight in (("lm_head", model.get_output_embeddings().weight), ("vision", vision_weight)):
        std = float(weight.detach().std())
        if not 0.7 * init_std < std < 1.3 * init_std:
            raise RuntimeError(f"{name} weight std {std:.4f} does not match init_std {init_std}")


def _set_generation_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, spec: _Family) -> None:
    """Make ``generate`` stop at the end-of-turn token and pad with the pad token."""
    generation = model.generation_config
    generation.bos_token_id = _token_id(tokenizer, spec.bos)
    generation.eos_token_id = _token_id(tokenizer, spec.eos)
    generation.pad_token_id = _token_id(tokenizer, spec.pad)


def _save_qwen_processor(tokenizer: PreTrainedTokenizerFast, out_dir: Path, shape: TinyShape) -> None:
    """Write the Qwen image processor config; ``tokenizer`` (saved already) carries the chat template.

    No ``processor_config.json`` is written: transformers' Qwen processors need a video
    processor (torchvision); ``load_processor`` builds an image-only one instead.
    """
    Qwen2VLImageProcessorPil(
        min_pixels=shape.qwen_min_tokens * QWEN_PIXELS_PER_TOKEN,
        max_pixels=shape.qwen_max_tokens * QWEN_PIXELS_PER_TOKEN,
        patch_size=QWEN_PATCH,
        temporal_patch_size=2,
        merge_size=QWEN_MERGE,
    ).save_pretrained(out_dir)


def _save_idefics3_processor(tokenizer: PreTrainedTokenizerFast, out_dir: Path, shape: TinyShape) -> None:
    """Write the Idefics3 processor (image processor, tokenizer, chat template)."""
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": shape.idefics3_image},
        max_image_size={"longest_edge": shape.idefics3_image},
    )
    image_processor.save_pretrained(out_dir)  # preprocessor_config.json, for loaders that read it alone
    Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=shape.idefics3_image_seq_len,
        chat_template=tokenizer.chat_template,
    ).save_pretrained(out_dir)


def write_marker(out_dir: Path, marker: dict) -> None:
    """Write ``livesight_demo.json``, which marks the directory as a generated model and says
    what it can do (``random_weights``: its answers are noise)."""
    (Path(out_dir) / DEMO_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
