"""Training the colours model: the server's prompts, in batches, through one forward pass each.

The answer alone is a poor teacher for yes/no. Whether "Is the screen red?" is answered yes
depends on the colour asked and the colour seen together, and on neither alone (yes is as
likely for every colour asked and every colour seen), so no single part of the model gets a
gradient until the others are in place: trained on its answers only, the tiny model stayed at
chance for hundreds of steps. So every prompt token teaches a step of the rule too
(``ColourTrainer._signals``): after an image, the newest image's colour; from the question's
colour word on, the answer; and an early layer's output (read through the model's own norm and
head) must hold both the colour seen and the colour asked, so both are at hand where the
answer is computed. With these, yes/no is learned in 200-300 steps.

Short prompts (one to four frames) teach the rule; ``finish`` then keeps it on prompts shaped
like a session's at the server's defaults (up to a whole window of one camera's frames, with the
questions and answers asked on the way among them, at the frame size the model is served at),
where the newest frame is one of many: trained on short prompts alone, the model lost the
newest frame's colour from about 18 served frames on, and trained on up to 16 it named the
previous scene's colour or answered nothing on prompts of 3,000 tokens and more.

A batch is right-padded to its longest prompt; its prompts show the same number of frames, so
they are about as long. Only the answer token and the end of turn after it are scored as the
answer (the first answer token decides a check).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from server.engines.prompt_encoding import Piece, PromptEncoder
from server.models.colour_frames import ColourFrame
from server.models.colour_prompts import COLOUR_OF, MAX_FRAMES, ColourExample, make_examples, make_stream_examples

TRAIN_STEPS = 400
BATCH = 16
LEARNING_RATE = 3e-3
WARMUP_STEPS = 30
ONE_FRAME_STEPS = 60  # the first steps show one frame: the colours are learned first
AUX_WEIGHT = 1.0  # the signals' losses against the answer's
LENS_LAYER = 1  # the layer whose output must hold both colours (signals of kinds 2 and 3)
CHECK_EVERY = 50  # steps between looks at the validation examples (all right: training stops)
FINISH_STEPS = 160  # then steps on session-shaped long prompts (``ColourTrainer.finish``)
FINISH_LR_DIVISOR = 5  # their learning rate: a tenth kept yes/no but named colours badly past ~30 frames,
#                        a third named them all but lost yes/no to 0.8
REPLAY_EVERY = 2  # a step on short prompts after every REPLAY_EVERY-th long one
FINISH_BATCH_FRAMES = 96  # frames in a step's batch of long prompts (a batch of 6-frame prompts is 16)
FINISH_FEWEST_FRAMES = 6
PROGRESS_EVERY_S = 10.0
ACCURACY_BATCH_FRAMES = 128  # frames in a batch of held-out examples (32 of four frames)


class ColourTrainer:
    """Trains a tiny model (in place) on examples and measures it: batches of the server's
    prompts, encoded by the engine's ``PromptEncoder``, through one forward pass each."""

    def __init__(self, model: PreTrainedModel, encoder: PromptEncoder, answers: dict[str, int], eos: int) -> None:
        self.model = model
        self.encoder = encoder
        self.answers = answers
        self.eos = eos
        self.pad = encoder.tokenizer.pad_token_id
        self.mrope = encoder.family.mrope

    def train(
        self,
        rng: np.random.Generator,
        clips: list[list[ColourFrame]],
        family: str,
        check: list[ColourExample],
        say: Callable[[str], None],
        started: float,
    ) -> int:
        """Train on examples drawn from ``clips`` until ``TRAIN_STEPS``, or until every ``check``
        example is right (looked at every ``CHECK_EVERY`` steps); returns the steps taken.
        ``say`` gets a progress line every ``PROGRESS_EVERY_S`` seconds and after each check."""
        optimiser = self._optimiser(LEARNING_RATE)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, _lr_factor)
        last_report = time.perf_counter()
        losses: list[float] = []
        self.model.train()
        for step in range(1, TRAIN_STEPS + 1):
            losses.append(self._step(optimiser, make_examples(rng, clips, family, BATCH,
                                                              frames=_frames_at(step, rng))))
            schedule.step()
            now = time.perf_counter()
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                say(f"livesight: training the colours model ({family}): step {step}/{TRAIN_STEPS}, "
                    f"loss {np.mean(losses[-20:]):.3f}, {now - started:.0f} s")
            if step % CHECK_EVERY == 0:
                scores = self.accuracy(check)
                self.model.train()
                say(f"livesight: training the colours model ({family}): step {step}, validation accuracy "
                    f"yes/no {scores['yes_no']:.3f}, naming {scores['naming']:.3f}")
                if min(scores.values()) >= 1.0:
                    return step
        return TRAIN_STEPS

    def finish(
        self, rng: np.random.Generator, streams: list[list[ColourFrame]], short: list[list[ColourFrame]], family: str,
        most_frames: int, say: Callable[[str], None], started: float, steps: int = FINISH_STEPS,
        after_step: Callable[[int], None] | None = None,
    ) -> None:
        """``steps`` (``FINISH_STEPS``) more steps on session-shaped prompts of ``FINISH_FEWEST_FRAMES`` to
        ``most_frames`` frames drawn from ``streams`` (``make_stream_examples``), at
        ``1 / FINISH_LR_DIVISOR`` of the learning rate, every ``REPLAY_EVERY``-th followed by a step on
        short prompts from ``short`` (so the yes/no rule, the most fragile, is kept): the short
        prompts of ``train`` teach the rule, these keep it where a session's prompt holds its whole
        window, earlier questions and answers among the frames, at the frame size the model is
        served at (the encoder's). ``after_step`` is called with each step's number once it is taken."""
        optimiser = self._optimiser(LEARNING_RATE / FINISH_LR_DIVISOR)
        self.model.train()
        losses: list[float] = []
        last_report = time.perf_counter()
        for step in range(1, steps + 1):
            frames = int(rng.integers(FINISH_FEWEST_FRAMES, most_frames + 1))
            batch = max(1, FINISH_BATCH_FRAMES // frames)
            losses.append(self._step(optimiser, make_stream_examples(rng, streams, family, batch, frames)))
            if step % REPLAY_EVERY == 0:
                self._step(optimiser, make_examples(rng, short, family, BATCH))
            if after_step is not None:
                after_step(step)
            now = time.perf_counter()
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                say(f"livesight: training the colours model ({family}): long prompts, step {step}/{steps}, "
                    f"loss {np.mean(losses[-10:]):.3f}, {now - started:.0f} s")
        say(f"livesight: training the colours model ({family}): {steps} steps on session prompts of "
            f"{FINISH_FEWEST_FRAMES}-{most_frames} frames, loss {np.mean(losses[-10:]):.3f}, "
            f"{time.perf_counter() - started:.0f} s")

    def _optimiser(self, lr: float) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def _step(self, optimiser: torch.optim.Optimizer, examples: list[ColourExample]) -> float:
        """One training step on ``examples`` (gradients clipped to norm 1); returns its loss."""
        loss = self._loss(examples)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in optimiser.param_groups for p in g["params"]], 1.0)
        optimiser.step()
        return float(loss.detach())

    def _loss(self, examples: list[ColourExample]) -> torch.Tensor:
        """The answer's loss (its token, then the end of turn), plus ``AUX_WEIGHT`` times the
        losses of direct signals on the prompt's own tokens (``_signals``), each a mean."""
        prompts = [self.encoder.encode(ex.prompt) for ex in examples]
        hidden, lens, ends = self._hidden(prompts, [ex.answer for ex in examples], lens=True)
        logp = torch.log_softmax(self.model.lm_head(hidden), dim=-1)
        rows = torch.arange(len(examples))
        index = torch.tensor(ends)
        answers = torch.tensor([self.answers[ex.answer] for ex in examples])
        loss = -(logp[rows, index, answers] + logp[rows, index + 1, self.eos]).mean() / 2
        if not AUX_WEIGHT:
            return loss
        lens_logp = torch.log_softmax(self.model.lm_head(lens), dim=-1)
        signals = [(i, *s) for i, (ex, pieces) in enumerate(zip(examples, prompts)) for s in self._signals(ex, pieces)]
        b, s, t, kind = (torch.tensor(v) for v in zip(*signals))
        picked = torch.where(kind < 2, logp[b, s, t], lens_logp[b, s, t])
        aux = sum(picked[kind == k].mean() for k in range(4) if bool((kind == k).any()))
        return loss - AUX_WEIGHT * aux

    def _signals(self, ex: ColourExample, pieces: list[Piece]) -> list[tuple[int, int, int]]:
        """(position, token, kind) targets on the prompt's tokens before its last, and on its
        last at ``LENS_LAYER``. The rule each teaches is the one a yes/no answer is made of:

        - kind 0, the output at every token after an image: the newest image's colour;
        - kind 1, the output from a yes/no question's colour word on: the answer;
        - kind 2, ``LENS_LAYER``'s output (read through the final norm and head) at every token
          after an image: the newest image's colour, so the first layers fetch it;
        - kind 3, ``LENS_LAYER``'s output from the colour word on: the colour asked about, so
          both colours are at hand where the answer is computed.
        """
        colours = iter(ex.frame_colours)
        ids = [i for p in pieces for i in p.ids]
        newest: list[int | None] = []
        current = None
        for piece in pieces:
            if piece.image_key is not None:
                current = self.answers[next(colours)]
            newest.extend([current] * len(piece.ids))
        last = len(ids) - 1
        word = _find_last(ids, self._question_tokens(ex.asked)) if ex.asked is not None else None
        answer = self.answers[ex.answer]
        signals = []
        for position in range(len(ids)):
            if newest[position] is not None:
                if position < last:
                    signals.append((position, newest[position], 0))
                signals.append((position, newest[position], 2))
            if word is not None and position >= word:
                if position < last:
                    signals.append((position, answer, 1))
                signals.append((position, self.answers[COLOUR_OF.get(ex.asked, ex.asked)], 3))
        return signals

    def _question_tokens(self, word: str) -> list[int]:
        """The tokens of ``word`` inside a question (after a space)."""
        return self.encoder.tokenizer(" " + word, add_special_tokens=False)["input_ids"]

    @torch.inference_mode()
    def accuracy(self, examples: list[ColourExample]) -> dict[str, float]:
        """Held-out accuracy: ``yes_no`` (P(yes) > 0.5 exactly when the question's colour is the
        newest frame's) and ``naming`` (the greedy answer is the colour's name, then the end of turn)."""
        self.model.eval()
        right = {"yes_no": [], "naming": []}
        for batch in _batches(examples, ACCURACY_BATCH_FRAMES):
            logits = self._logits(batch)
            for ex, row in zip(batch, logits):
                if ex.kind == "yes_no":
                    p_yes = float(torch.softmax(row[0], -1)[self.answers["yes"]])
                    right["yes_no"].append((p_yes > 0.5) == (ex.answer == "yes"))
                else:
                    greedy = [int(row[0].argmax()), int(row[1].argmax())]
                    right["naming"].append(greedy == [self.answers[ex.answer], self.eos])
        return {k: round(float(np.mean(v)), 4) for k, v in right.items()}

    def _logits(self, examples: list[ColourExample]) -> torch.Tensor:
        """Logits (B, 2, vocab) after each prompt and after its answer token."""
        prompts = [self.encoder.encode(ex.prompt) for ex in examples]
        hidden, _, ends = self._hidden(prompts, [ex.answer for ex in examples])
        index = torch.tensor(ends)
        rows = torch.arange(len(examples))
        return self.model.lm_head(torch.stack([hidden[rows, index], hidden[rows, index + 1]], 1))

    def _hidden(
        self, prompts: list[list[Piece]], answers: list[str], lens: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        """The last hidden states (B, S, hidden) of each prompt followed by its answer token,
        right-padded; with ``lens``, those of ``LENS_LAYER`` through the final norm; the index
        of each prompt's last token.

        Right padding needs no attention mask: a causal model's outputs at real tokens never
        see the padding after them. Positions are the engine's (``position_ids`` from 0)."""
        rows, positions, images, ends = [], [], [], []
        for pieces, answer in zip(prompts, answers):
            ids = [i for p in pieces for i in p.ids] + [self.answers[answer]]
            pos, _ = self.encoder.position_ids(pieces, 0)
            pos = torch.cat([pos, pos.max(dim=-1, keepdim=True).values + 1], dim=-1)
            rows.append(ids)
            positions.append(pos)
            ends.append(len(ids) - 2)
            images.extend(self.encoder.pixel_inputs(p) for p in pieces if p.image_key is not None)
        length = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
        position_ids = torch.cat([_pad_positions(p, length) for p in positions], dim=-2)
        dim = 0 if self.mrope else 1
        pixels = {k: torch.cat([img[k] for img in images], dim=dim) for k in images[0]}
        out = self.model.model(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, output_hidden_states=lens, **pixels
        )
        lensed = self.model.get_decoder().norm(out.hidden_states[LENS_LAYER]) if lens else None
        return out.last_hidden_state, lensed, ends


def _batches(examples: list[ColourExample], most_frames: int) -> list[list[ColourExample]]:
    """``examples`` in order, in batches of at most ``most_frames`` frames (one example at least)."""
    batches: list[list[ColourExample]] = [[]]
    frames = 0
    for ex in examples:
        if batches[-1] and frames + len(ex.frame_colours) > most_frames:
            batches.append([])
            frames = 0
        batches[-1].append(ex)
        frames += len(ex.frame_colours)
    return [b for b in batches if b]


def _find_last(ids: list[int], sub: list[int]) -> int | None:
    """The index of the last token of the last occurrence of ``sub`` in ``ids``, or None."""
    for end in range(len(ids), len(sub) - 1, -1):
        if ids[end - len(sub) : end] == sub:
            return end - 1
    return None


def _pad_positions(pos: torch.Tensor, length: int) -> torch.Tensor:
    """``pos`` ((3, 1, n) or (1, n)) continued to ``length`` columns (padding positions)."""
    n = pos.shape[-1]
    if n == length:
        return pos
    tail = pos[..., -1:] + torch.arange(1, length - n + 1)
    return torch.cat([pos, tail], dim=-1)


def _frames_at(step: int, rng: np.random.Generator) -> int:
    """Frames in each prompt of a step's batch: one for the first ``ONE_FRAME_STEPS`` (the
    colours are learned first), then one to ``MAX_FRAMES``; the same for the whole batch, so
    its prompts are about as long (little padding)."""
    return 1 if step <= ONE_FRAME_STEPS else int(rng.integers(1, MAX_FRAMES + 1))


def _lr_factor(step: int) -> float:
    """Linear warmup, then a cosine down to a tenth."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, TRAIN_STEPS - WARMUP_STEPS))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
