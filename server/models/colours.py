"""A tiny image-text model trained here to see one thing: the colour of the screen.

``make_colours_model`` builds a tiny model of either family (``tiny.build_tiny_model``) and
trains it on this machine, in a few minutes on two cores, on generated camera frames
(``colour_frames``) of a few image tokens each, to answer

- "Is the screen red?" with ``yes`` or ``no``, as one token, so P(yes) can be read from the
  first answer token's distribution with no decoding;
- "What colour is the screen?" (and paraphrases) with the colour's name, as one token,

about the newest frame of the prompt, for ``COLOURS``. The training prompts are the
server's: rendered by the session's own renderer (``handlers.core.prompt``) with a system
prompt, earlier turns, one to four timestamped frames, and encoded by the engine's own
``PromptEncoder`` with the processor the model ships, so training sees exactly the tokens,
positions and pixels inference sees. How it is trained: ``colour_training``. The model is
saved with a processor that serves frames of a real small model's size (Qwen: about 64 image
tokens, ``COLOURS_SHAPE``); training ends with steps on session-shaped prompts of 6 to 64 frames
at that size (a session's prompt holds its whole window: the newest frame is one of many), and
the accuracy is measured at that size, on prompts of one to four frames and of 16, 50 and 64.

The answer tokens, the accuracy on held-out frames and how the model was trained go into
``livesight_demo.json`` (``task: "colours"``); ``read_colours_card`` reads them back.
Training is deterministic given the seed (the thread count and the kernels are fixed:
``PORTABLE_NUMERICS``), and the card records
fingerprints of the weights on the way, so ``retrace_colours_model`` shows in a third of the
time that this recipe makes a given model.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from handlers.wire.protocol import SessionConfig
from server.engines.hf_loading import load_processor, model_family, model_image_side
from server.engines.prompt_encoding import PromptEncoder
from server.models.colour_frames import COLOURS, colour_clip
from server.models.colour_prompts import (
    ColourExample, answer_text, example_sentences, make_examples, make_stream_examples,
)
from server.models.colour_training import BATCH, FINISH_STEPS, ColourTrainer
from server.models.tiny import DEMO_MARKER, TinyShape, build_tiny_model, save_tiny_model, write_marker

TASK = "colours"
#: The recipe's version, in the card: a shipped or cached model of another version is not served.
VERSION = 5  # 1 random weights; 2 small frames; 3 short prompts; 4 prompts of up to 16 frames
#: A session's window at the server's defaults (``session.config``'s ``max_frames``).
DEFAULT_WINDOW = int(SessionConfig.model_fields["max_frames"].default)

# Trained on small images: a Qwen frame is at most 3x4 image tokens (28 px each), an Idefics3
# frame one 64 px image in 8 px patches, pixel-shuffled to 4x4 tokens. Colour needs no more,
# and a training step costs what its tokens do.
TRAIN_SHAPE = TinyShape(vocab=900, qwen_min_tokens=4, qwen_max_tokens=12, idefics3_image=64)
# Served at a real small model's frame size for Qwen: a 320x240 frame is 7x9 = 63 image tokens
# (at most 72; SmolVLM's are 64), so a prompt of many frames costs a prefill what a real
# model's does, in tokens. The model reads a frame's colour the same from more tokens of it
# (the held-out accuracy is measured at this size). Idefics3 stays at its training size: its
# vision tower's positions are sized for it.
COLOURS_SHAPE = replace(TRAIN_SHAPE, qwen_max_tokens=72)

#: The environment training runs in (``livesight make-tiny-model --task colours`` starts itself
#: again in it): the same kernels on every x86-64 CPU with AVX2 (torch's own capped at AVX2,
#: MKL's matrix products on its path for any processor, oneDNN's capped at AVX2, and off while
#: training: ``_training_threads``), so the weights do not depend on the CPU that trains them.
#: Left to choose, each library takes the CPU's widest path (AVX-512 where there is one), and
#: its sums round differently there.
PORTABLE_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def portable_numerics_missing() -> dict[str, str]:
    """``PORTABLE_NUMERICS`` with this process's environment over it, when the environment lacks
    any of it on an x86-64 machine (read once when torch first computes: only a new process
    takes it); ``{}`` when it holds them, or on another architecture."""
    import os
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    if all(os.environ.get(k) == v for k, v in PORTABLE_NUMERICS.items()):
        return {}
    return {**os.environ, **PORTABLE_NUMERICS}


# One thread: on two cores shared with other work, two threads made a training step 5-12 times
# slower (each tiny operation waits for the busier core), and a fixed count keeps it deterministic.
TRAIN_THREADS = 1
TRAIN_CLIPS = 320  # clips of CLIP_FRAMES frames the training prompts are drawn from
CHECK_CLIPS = 40
HELD_OUT_CLIPS = 100
HELD_OUT_EXAMPLES = 420
CLIP_FRAMES = 4
#: The longest prompt, in frames, the model is trained on: past a session's window at the server's
#: defaults (50 frames), up to vLLM's default limit of images per prompt (64).
TRAINED_PROMPT_FRAMES = 64
#: The longest prompt it declares (``max_prompt_frames`` in its card), which the engines keep a
#: session's prompts within: the default window, where its held-out accuracy is measured at 95% or
#: more (on 64-frame prompts naming falls to about 0.85).
MAX_PROMPT_FRAMES = DEFAULT_WINDOW
STREAMS = 40  # recordings of STREAM_FRAMES frames the session-shaped prompts are drawn from
STREAM_FRAMES = 80
SCENE_FRAMES = (1, 30)  # how long the screen keeps a colour in a stream, in frames
HELD_OUT_STREAMS = 16
SHORT_CLIPS = 80  # clips of CLIP_FRAMES frames at the served size, replayed while training on long prompts
HELD_OUT_WINDOWS = (16, DEFAULT_WINDOW, TRAINED_PROMPT_FRAMES)  # held-out session prompts of these many frames
HELD_OUT_PER_WINDOW = 120
#: The card records fingerprints of the weights (``weights_fingerprint``) after the short prompts
#: and this many steps into the session prompts: ``retrace_colours_model`` trains that far again
#: (``make-tiny-model DIR --task colours --retrace``), a third of the training, to show the recipe
#: still makes a model.
RETRACE_FINISH_STEPS = 8
#: The weights file the card's ``training.weights_sha256`` is of: the trained model, to its end.
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ColoursCard:
    """What ``livesight_demo.json`` says of a colours model: the single token each answer is
    (``yes``, ``no``, every colour's name) and its accuracy on held-out frames
    (``yes_no``, ``naming``, and on session prompts of N frames ``yes_no_N_frames``, ...), and the
    most frames a prompt of it should hold (``max_prompt_frames``)."""

    family: str
    yes_token_id: int
    no_token_id: int
    colour_token_ids: dict[str, int]
    accuracy: dict[str, float]
    max_prompt_frames: int | None = None  # the longest prompt it was trained on (None: not said)
    version: int | None = None  # the recipe's (``VERSION``) that wrote it
    seed: int = 0
    fingerprints: dict[str, str] = field(default_factory=dict)  # the weights' on the way (``RETRACE_FINISH_STEPS``)

    @property
    def current(self) -> bool:
        """True when this recipe wrote it (``VERSION``): a model of another version is not served."""
        return self.version == VERSION


def read_colours_card(model_dir: Path) -> ColoursCard | None:
    """The colours card of a generated model directory, or None for any other model.

    Raises ``ValueError`` when the directory claims the colours task but its card is broken.
    """
    path = Path(model_dir) / DEMO_MARKER
    if not path.is_file():
        return None
    marker = json.loads(path.read_text(encoding="utf-8"))
    if marker.get("task") != TASK:
        return None
    try:
        tokens = marker["answer_token_ids"]
        return ColoursCard(
            family=marker["family"], yes_token_id=int(tokens["yes"]), no_token_id=int(tokens["no"]),
            colour_token_ids={c: int(tokens[c]) for c in marker["colours"]}, accuracy=dict(marker["accuracy"]),
            max_prompt_frames=int(marker["max_prompt_frames"]) if "max_prompt_frames" in marker else None,
            version=int(marker["version"]) if "version" in marker else None,
            seed=int(marker.get("seed", 0)),
            fingerprints={str(k): str(v) for k, v in marker.get("training", {}).get("fingerprints", {}).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"broken colours card in {path}: {exc!r}") from exc


def make_colours_model(
    out_dir: Path, family: str = "qwen2_5_vl", seed: int = 0, progress: Callable[[str], None] | None = None
) -> Path:
    """Write a tiny model of ``family`` trained to tell the screen's colour into ``out_dir``.

    ``progress`` gets a line now and then while it trains (default: stderr). Returns the
    directory. Raises ``ValueError`` for an unknown family.
    """
    say = progress or _stderr
    started = time.perf_counter()
    with _training_threads(seed):
        run = _train(Path(out_dir), family, seed, say, started, FINISH_STEPS)
        _finish_card(Path(out_dir), run, say, started)
    return Path(out_dir)


def retrace_colours_model(
    out_dir: Path, family: str = "qwen2_5_vl", seed: int = 0, progress: Callable[[str], None] | None = None
) -> dict[str, str]:
    """Train ``family``'s colours model again (into ``out_dir``) only as far as its last
    fingerprint, ``RETRACE_FINISH_STEPS`` steps into its session prompts (about a third of the
    training), and return its fingerprints: the same as a card's ``training.fingerprints`` when
    this recipe, run to its end, wrote that model (training is deterministic)."""
    with _training_threads(seed):
        run = _train(Path(out_dir), family, seed, progress or _stderr, time.perf_counter(), RETRACE_FINISH_STEPS)
    return run.fingerprints


def file_sha256(path: Path) -> str:
    """SHA-256 of the file at ``path`` (the card records its weights file's: ``WEIGHTS_FILE``)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of every tensor of ``model``'s state, by name, as its bytes: equal only for
    bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@contextmanager
def _training_threads(seed: int) -> Iterator[None]:
    """``TRAIN_THREADS`` torch threads, torch's generator seeded and oneDNN off (its kernels size
    their blocks by the CPU's caches: a convolution then sums in another order; without it
    torch's own kernels and MKL do the work), all restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        with torch.random.fork_rng(devices=[]), torch.backends.mkldnn.flags(enabled=False):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Run:
    """A training run: the model, its trainer, and what the card says of how it went."""

    family: str
    seed: int
    model: torch.nn.Module
    tokenizer: object
    trainer: ColourTrainer
    side: int  # the longest frame side worth drawing for the served frame size
    steps: int
    trained_tokens: dict[str, int]
    fingerprints: dict[str, str]


def _train(out_dir: Path, family: str, seed: int, say: Callable[[str], None], started: float,
           finish_steps: int) -> _Run:
    """The recipe's training, its session-prompt steps stopped after ``finish_steps``; the
    weights are fingerprinted after the short prompts and ``RETRACE_FINISH_STEPS`` steps after."""
    model, tokenizer = build_tiny_model(family, COLOURS_SHAPE, seed=seed, extra_sentences=example_sentences(seed))
    save_tiny_model(out_dir, family, model, tokenizer, TRAIN_SHAPE)
    encoder, side = _encoder(out_dir, model)  # exactly what the engine would load, at the training size
    answers = _answer_ids(encoder.tokenizer, family)
    rng = np.random.default_rng(seed)
    say(f"livesight: training the colours model ({family}): drawing frames...")
    train = _clips(rng, TRAIN_CLIPS, side)
    check = make_examples(rng, _clips(rng, CHECK_CLIPS, side), family, 160)
    trainer = ColourTrainer(model, encoder, answers, tokenizer.eos_token_id)
    steps = trainer.train(rng, train, family, check, say, started)
    fingerprints = {"short_prompts": weights_fingerprint(model)}
    trained_tokens = _image_tokens(encoder, check)
    save_tiny_model(out_dir, family, model, tokenizer, COLOURS_SHAPE)
    trainer.encoder, side = _encoder(out_dir, model)  # what the engine will load: the served frame size
    short = _clips(rng, SHORT_CLIPS, side)  # the served frame size, for the short prompts the long steps replay

    def fingerprint(step: int) -> None:
        if step == RETRACE_FINISH_STEPS:
            fingerprints[f"session_prompts_{step}_steps"] = weights_fingerprint(model)

    trainer.finish(rng, _streams(rng, STREAMS, side), short, family, TRAINED_PROMPT_FRAMES, say, started,
                   steps=finish_steps, after_step=fingerprint)
    return _Run(family, seed, model, tokenizer, trainer, side, steps, trained_tokens, fingerprints)


def _finish_card(out_dir: Path, run: _Run, say: Callable[[str], None], started: float) -> None:
    """Save the trained model, measure it on held-out prompts and write its card."""
    family, seed, model, trainer = run.family, run.seed, run.model, run.trainer
    model.eval()
    save_tiny_model(out_dir, family, model, run.tokenizer, COLOURS_SHAPE)
    side = run.side
    held_rng = np.random.default_rng([seed, 1])  # frames and prompts training never sees
    held_out = make_examples(held_rng, _clips(held_rng, HELD_OUT_CLIPS, side), family, HELD_OUT_EXAMPLES)
    accuracy = trainer.accuracy(held_out)
    streams = _streams(held_rng, HELD_OUT_STREAMS, side)
    for frames in HELD_OUT_WINDOWS:
        scores = trainer.accuracy(make_stream_examples(held_rng, streams, family, HELD_OUT_PER_WINDOW, frames))
        accuracy.update({f"{kind}_{frames}_frames": value for kind, value in scores.items()})
    seconds = time.perf_counter() - started
    say(
        f"livesight: colours model ({family}) trained in {seconds:.0f} s ({run.steps} steps): "
        f"held-out yes/no accuracy {accuracy['yes_no']:.3f}, naming accuracy {accuracy['naming']:.3f}"
    )
    write_marker(out_dir, {
        "random_weights": False,
        "task": TASK,
        "version": VERSION,
        "family": family,
        "seed": seed,
        "colours": list(COLOURS),
        "answer_token_ids": trainer.answers,
        "answer_texts": {word: answer_text(word, family) for word in trainer.answers},
        "image_tokens_per_frame": _image_tokens(trainer.encoder, held_out),
        "max_prompt_frames": MAX_PROMPT_FRAMES,
        "accuracy": accuracy,
        "training": {"steps": run.steps, "batch": BATCH, "seconds": round(seconds, 1), "threads": TRAIN_THREADS,
                     "image_tokens_per_frame": run.trained_tokens, "fingerprints": run.fingerprints,
                     "weights_sha256": file_sha256(out_dir / WEIGHTS_FILE)},
        "note": (
            "Tiny model generated and trained by livesight for demos and tests: it answers yes/no to "
            "'Is the screen <colour>?' (read P(yes) from answer_token_ids) and names the screen's colour "
            "(What colour is the screen?) for the newest frame; anything else gets noise."
        ),
    })


def _encoder(model_dir: Path, model: torch.nn.Module) -> tuple[PromptEncoder, int]:
    """The engine's prompt encoder for the processor saved in ``model_dir``, and the longest
    frame side worth drawing for it."""
    processor = load_processor(str(model_dir))
    encoder = PromptEncoder(processor, model_family(model.config), max_cached_images=4096)
    return encoder, model_image_side(processor.image_processor, 1024)


def _clips(rng: np.random.Generator, count: int, side: int, frames: int = CLIP_FRAMES) -> list[list]:
    """``count`` clips of ``frames`` frames; each frame's colour is the next one's or another."""
    clips = []
    for index in range(count):
        colours = [COLOURS[index % len(COLOURS)]]
        for _ in range(frames - 1):
            colours.insert(0, colours[0] if rng.random() < 0.4 else COLOURS[int(rng.integers(len(COLOURS)))])
        clips.append(colour_clip(rng, colours, side))
    return clips


def _streams(rng: np.random.Generator, count: int, side: int) -> list[list]:
    """``count`` recordings of ``STREAM_FRAMES`` frames of one camera each, the screen keeping
    a colour for ``SCENE_FRAMES`` frames, then changing to another."""
    streams = []
    for _ in range(count):
        colours: list[str] = []
        while len(colours) < STREAM_FRAMES:
            colour = str(rng.choice([c for c in COLOURS if not colours or c != colours[-1]]))
            colours.extend([colour] * int(rng.integers(SCENE_FRAMES[0], SCENE_FRAMES[1] + 1)))
        streams.append(colour_clip(rng, colours[:STREAM_FRAMES], side))
    return streams


def _answer_ids(tokenizer, family: str) -> dict[str, int]:
    """Every answer word's token id; raises ``RuntimeError`` if one is not a single token."""
    ids = {}
    for word in ("yes", "no", *COLOURS):
        tokens = tokenizer(answer_text(word, family), add_special_tokens=False)["input_ids"]
        if len(tokens) != 1:
            raise RuntimeError(f"answer {word!r} is {len(tokens)} tokens, not one")
        ids[word] = int(tokens[0])
    return ids


def _image_tokens(encoder: PromptEncoder, examples: list[ColourExample]) -> dict[str, int]:
    """Image tokens of one frame: the fewest and the most among ``examples``' frames."""
    counts = [encoder.image_tokens([p]) for ex in examples[:50] for p in encoder.encode(ex.prompt) if p.image_key]
    return {"min": min(counts), "max": max(counts)}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
