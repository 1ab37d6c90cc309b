"""The generated demo models load and run through the same loaders as real models."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from server.engines.hf_loading import load_model, load_processor, model_family
from server.models.tiny import DEMO_MARKER, FAMILIES, is_demo_model, make_tiny_model

# Image tokens for one 320x240 frame: Qwen2.5-VL covers 28x28 px per token (9x11 grid),
# Idefics3 always gives 256 (one 256 px image, no splitting).
IMAGE_TOKENS_320x240 = {"qwen2_5_vl": 99, "idefics3": 256}
IMAGE_PART_TEXT = {"qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "idefics3": "<image>"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One generated model directory per family, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("tiny")
    return {family: make_tiny_model(root / family, family) for family in FAMILIES}


def _frame(width: int, height: int) -> Image.Image:
    """Return a noisy RGB frame of the given size."""
    generator = torch.Generator().manual_seed(width * height)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
    return Image.fromarray(pixels.numpy())


def _question(text: str = "What do you see?") -> list[dict]:
    """Return a system prompt plus one user turn with an image and a question."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]},
    ]


def _image_token_count(model_dir: Path, width: int, height: int) -> int:
    """Return how many image placeholder tokens one frame of this size becomes."""
    processor = load_processor(str(model_dir))
    prompt = processor.apply_chat_template(_question(), tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[_frame(width, height)], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int((inputs["input_ids"] == image_token_id).sum())


@pytest.mark.parametrize("family", FAMILIES)
def test_generated_model_answers_about_a_frame(model_dirs: dict[str, Path], family: str) -> None:
    """A generated model loads, takes a chat prompt with one 320x240 frame and generates tokens."""
    model = load_model(str(model_dirs[family]))
    processor = load_processor(str(model_dirs[family]))
    prompt = processor.apply_chat_template(_question(), tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[_frame(320, 240)], return_tensors="pt")

    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1]:]

    assert image_tokens == IMAGE_TOKENS_320x240[family]
    assert 1 <= len(new_tokens) <= 5
    assert int(new_tokens.max()) < len(processor.tokenizer)
    assert model.dtype == torch.float32 and not model.training


def test_qwen_frames_are_capped_at_256_tokens(model_dirs: dict[str, Path]) -> None:
    """A 640x480 frame gives at most 256 Qwen image tokens, more than a 320x240 one."""
    small = _image_token_count(model_dirs["qwen2_5_vl"], 320, 240)
    large = _image_token_count(model_dirs["qwen2_5_vl"], 640, 480)

    assert small < large <= 256


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_renders_system_strings_images_and_generation_prompt(
    model_dirs: dict[str, Path], family: str
) -> None:
    """The chat template takes string or part-list content, a system role and the generation prompt."""
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[family])
    messages = _question("Is it red?") + [
        {"role": "assistant", "content": "No."},
        {"role": "user", "content": "And now?"},
    ]

    with_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    without_prompt = tokenizer.apply_chat_template(messages, tokenize=False)

    assert IMAGE_PART_TEXT[family] in with_prompt
    for text in ("You are a helpful assistant.", "Is it red?", "No.", "And now?"):
        assert text in with_prompt
    assert with_prompt.startswith(without_prompt) and len(with_prompt) > len(without_prompt)


@pytest.mark.parametrize("family", FAMILIES)
def test_init_std_sets_the_weight_spread(tmp_path: Path, family: str) -> None:
    """``init_std`` sets the std of both text and vision weights (a 'sharp' model)."""
    sharp = load_model(str(make_tiny_model(tmp_path / "sharp", family, init_std=0.3)))
    default = load_model(str(make_tiny_model(tmp_path / "default", family)))

    def spread(model: torch.nn.Module, part: str) -> float:
        weight = next(p for n, p in model.named_parameters() if part in n and p.dim() == 2)
        return float(weight.detach().std())

    for part in ("lm_head", "visual" if family == "qwen2_5_vl" else "vision_model"):
        assert spread(sharp, part) == pytest.approx(0.3, rel=0.1)
        assert spread(default, part) == pytest.approx(0.02, rel=0.1)


def test_seed_makes_weights_reproducible(tmp_path: Path) -> None:
    """The same seed writes the same weights; another seed writes different ones."""
    first = load_model(str(make_tiny_model(tmp_path / "a", "idefics3", seed=1))).lm_head.weight
    again = load_model(str(make_tiny_model(tmp_path / "b", "idefics3", seed=1))).lm_head.weight
    other = load_model(str(make_tiny_model(tmp_path / "c", "idefics3", seed=2))).lm_head.weight

    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("family", FAMILIES)
def test_demo_marker_says_random_weights(model_dirs: dict[str, Path], family: str) -> None:
    """``livesight_demo.json`` marks the directory as a random-weight demo of its family."""
    marker = json.loads((model_dirs[family] / DEMO_MARKER).read_text(encoding="utf-8"))

    assert is_demo_model(model_dirs[family])
    assert marker["random_weights"] is True and marker["family"] == family and marker["note"]


def test_multibyte_characters_span_several_tokens(model_dirs: dict[str, Path]) -> None:
    """Multi-byte characters encode to several byte tokens and decode back intact."""
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["qwen2_5_vl"])

    for text in ("café", "日本語", "😀"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) > len(text)
        assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(("family", "expected"), [("qwen2_5_vl", "qwen2_vl"), ("idefics3", "plain")])
def test_model_family_tells_mrope_models_apart(model_dirs: dict[str, Path], family: str, expected: str) -> None:
    """``model_family`` names the multimodal-rotary family and calls the rest plain."""
    assert model_family(load_model(str(model_dirs[family])).config) == expected


def test_processor_path_is_logged(model_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """Loading a processor logs which kind of processor was built."""
    with caplog.at_level(logging.INFO, logger="livesight.engines"):
        processor = load_processor(str(model_dirs["qwen2_5_vl"]))

    assert any(type(processor).__name__ in record.getMessage() for record in caplog.records)


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    """An unknown family name raises ValueError naming the choices."""
    with pytest.raises(ValueError, match="qwen2_5_vl"):
        make_tiny_model(tmp_path, "llava")


def test_missing_model_raises_with_its_path(tmp_path: Path) -> None:
    """Loading from a directory without a model raises RuntimeError naming the path."""
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        load_model(str(tmp_path))
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        load_processor(str(tmp_path))
