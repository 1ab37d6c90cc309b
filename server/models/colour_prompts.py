"""The questions the colours model learns, rendered as the server renders a session's prompt.

An example is a ``Prompt`` built by the session's renderer (``handlers.core.prompt``) from
session ``Frame`` objects: a system prompt (the default or another), sometimes an earlier
exchange kept as text or an earlier live turn with its frames, then one to four timestamped
frames (or as many as asked for) and the question. The answer is about the newest frame only.

A stream example (``make_stream_examples``) is a session's prompt at the server's defaults:
a whole window of one camera's frames (up to the longest prompt the model declares), cut into
live turns by the questions asked on the way, then the question.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from handlers.core.frames import Frame
from handlers.core.prompt import Exchange, render_timeline
from handlers.core.timeline import TimelineTurn
from handlers.media.frame_image import FrameImage
from server.engines.base import Prompt
from server.models.colour_frames import COLOURS, ColourFrame

YES_NO_QUESTIONS = (
    "Is the screen {c}?", "Is the screen {c} now?", "Is it {c}?", "Is the picture {c}?", "Is the image {c}?",
    "Is this {c}?", "Is the frame mostly {c}?", "Does the screen look {c}?", "Is the screen {c} right now?",
)
NAMING_QUESTIONS = (
    "What colour is the screen?", "What color is the screen?", "What colour is it?", "What color is it?",
    "Which colour do you see?", "Which color do you see?", "What colour is the picture?",
    "What is the colour of the screen?", "What colour is the screen now?", "What color do you see?",
)
#: What a question may end with (as a client's template might add).
YES_NO_ENDINGS = (" Answer yes or no.", " Yes or no?", " Answer in one word.")
NAMING_ENDINGS = (" Answer in one word.", " One word.")
SYNONYMS = {"grey": ("grey", "gray")}  # words a question may use for a colour
COLOUR_OF = {word: colour for colour, words in SYNONYMS.items() for word in words}

_SYSTEM_PROMPTS = (
    None,  # the server's default
    None,
    None,
    "You are watching a camera. Answer in one word.",
    "Answer yes or no, or name the colour.",
    "You are a helpful assistant.",
    "You watch a live video and answer questions about the latest frame.",
)
_FRAME_GAPS_S = (0.25, 0.5, 1.0, 2.0)
MAX_FRAMES = 4
_STREAM_ASK_EVERY = (2, 16)  # frames between the questions of a stream example (at least, below)
_STREAM_RIGHT_ANSWERS = 0.9  # the share of a stream's earlier answers that were right


@dataclass(frozen=True)
class ColourExample:
    """A prompt and its one-word answer; ``kind`` says which question it asks."""

    prompt: Prompt
    answer: str  # "yes", "no" or a colour
    kind: Literal["yes_no", "naming"]
    colour: str  # the newest frame's colour
    frame_colours: tuple[str, ...]  # every frame's colour, in prompt order
    asked: str | None  # the colour word of a yes/no question, as written ("gray" for grey, say)


def answer_text(word: str, family: str) -> str:
    """The text the model generates for ``word``: Idefics3's template ends "Assistant:", so
    its answers start with a space (as SmolVLM's do); Qwen's ends with a new line."""
    return " " + word if family == "idefics3" else word


def example_sentences(seed: int) -> tuple[str, ...]:
    """Sentences for the tokenizer's corpus, so that every answer is one token in both of its
    forms ("yes" after a new line, " yes" after a word) and the questions tokenize compactly."""
    rng = np.random.default_rng([seed, 7])
    lines = []
    words = ("yes", "no", *COLOURS, "gray")
    for _ in range(150):
        lines.extend(words)
        lines.extend(f"is {word}" for word in words)
    for template in YES_NO_QUESTIONS:
        for colour in (*COLOURS, "gray"):
            lines.append(f"{template.format(c=colour)} {rng.choice(['yes', 'no'])}")
    for template in NAMING_QUESTIONS:
        for colour in COLOURS:
            lines.append(f"{template} {colour}")
    return tuple(lines)


def make_examples(
    rng: np.random.Generator,
    clips: list[list[ColourFrame]],
    family: str,
    count: int,
    frames: int | None = None,
) -> list[ColourExample]:
    """``count`` examples over frames of ``clips``: a third naming questions, a third yes/no
    questions whose answer is yes, a third no. Each shows ``frames`` frames (default: one to
    ``MAX_FRAMES``, drawn for each example)."""
    examples = []
    for index in range(count):
        kind = ("naming", "yes", "no")[index % 3]
        shown = frames if frames is not None else int(rng.integers(1, MAX_FRAMES + 1))
        examples.append(_example(rng, clips, family, kind, shown))
    return examples


def _example(
    rng: np.random.Generator, clips: list[list[ColourFrame]], family: str, kind: str, shown: int
) -> ColourExample:
    """One example showing ``shown`` frames: sometimes the first of them in an earlier turn."""
    split = int(rng.integers(1, shown)) if shown > 1 and rng.random() < 0.3 else 0
    frames = _run(rng, clips, shown - split)
    newest = frames[-1].colour
    turns: list[TimelineTurn] = []
    history: list[Exchange] = []
    gap = float(rng.choice(_FRAME_GAPS_S))
    start = float(rng.uniform(0, 120))
    times = [start + gap * i for i in range(max(shown, MAX_FRAMES))]
    earlier: list[ColourFrame] = []
    if split:
        earlier = _run(rng, clips, split)
        question, answer, _ = _question(rng, str(rng.choice(["naming", "yes", "no"])), earlier[-1].colour)
        turns.append(TimelineTurn.of(_session_frames(earlier, times), question, answer_text(answer, family)))
        times = times[len(earlier):]
    if rng.random() < 0.15:
        question, answer, _ = _question(rng, str(rng.choice(["naming", "yes", "no"])), str(rng.choice(COLOURS)))
        history.append(Exchange(question, answer_text(answer, family)))
    question, answer, asked = _question(rng, kind, newest)
    prompt = render_timeline(
        system_prompt=_SYSTEM_PROMPTS[int(rng.integers(len(_SYSTEM_PROMPTS)))],
        history=history,
        turns=turns,
        open_frames=_session_frames(frames, times),
        origin=Frame(seq=0, key="origin", data=None, receive_ts_ms=0.0, pts_ms=0.0),
        timestamps=bool(rng.random() < 0.8),
        question=question,
    )
    shown = tuple(f.colour for f in (earlier if turns else [])) + tuple(f.colour for f in frames)
    return ColourExample(prompt, answer, "naming" if kind == "naming" else "yes_no", newest, shown, asked)


def _run(rng: np.random.Generator, clips: list[list[ColourFrame]], count: int) -> list[ColourFrame]:
    """``count`` consecutive frames of one clip (or, now and then, of two)."""
    clip = clips[int(rng.integers(len(clips)))]
    if count > 1 and rng.random() < 0.2:
        other = clips[int(rng.integers(len(clips)))]
        cut = int(rng.integers(1, count))
        return other[len(other) - cut :] + clip[len(clip) - (count - cut) :]
    first = int(rng.integers(0, len(clip) - count + 1))
    return clip[first : first + count]


def _question(rng: np.random.Generator, kind: str, colour: str) -> tuple[str, str, str | None]:
    """A question of ``kind`` ("naming", "yes", "no") about a frame of ``colour``: the question,
    its answer and the colour word it asks about (None for a naming question)."""
    word = None
    if kind == "naming":
        question, answer = NAMING_QUESTIONS[int(rng.integers(len(NAMING_QUESTIONS)))], colour
    else:
        asked = colour if kind == "yes" else str(rng.choice([c for c in COLOURS if c != colour]))
        names = SYNONYMS.get(asked, (asked,))
        word = names[int(rng.integers(len(names)))]
        template = YES_NO_QUESTIONS[int(rng.integers(len(YES_NO_QUESTIONS)))]
        question, answer = template.format(c=word), kind
    if rng.random() < 0.15:
        question = question[0].lower() + question[1:]
    if rng.random() < 0.15:
        endings = NAMING_ENDINGS if kind == "naming" else YES_NO_ENDINGS
        question += endings[int(rng.integers(len(endings)))]
    return question, answer, word


def _session_frames(frames: list[ColourFrame], times_s: list[float]) -> list[Frame]:
    """Session frames for ``frames``, shown at ``times_s`` (their pixels as intake decoded them)."""
    return [
        Frame(seq=i + 1, key=f.key, data=None, receive_ts_ms=t * 1000, pts_ms=t * 1000,
              image=FrameImage.decoded(f.pixels))
        for i, (f, t) in enumerate(zip(frames, times_s))
    ]


def make_stream_examples(
    rng: np.random.Generator, streams: list[list[ColourFrame]], family: str, count: int, frames: int
) -> list[ColourExample]:
    """``count`` examples shaped like a session's prompt at the server's defaults: a window of
    ``frames`` consecutive frames of one camera (``streams``: whole recordings, the screen's
    colour changing now and then) cut into live turns by the questions asked on the way (each
    answered, mostly right), sometimes after exchanges kept as text, then the question about the
    newest frame. A third naming, a third yes, a third no, as ``make_examples``."""
    return [_stream_example(rng, streams, family, ("naming", "yes", "no")[i % 3], frames) for i in range(count)]


def _stream_example(
    rng: np.random.Generator, streams: list[list[ColourFrame]], family: str, kind: str, frames: int
) -> ColourExample:
    """One session-shaped example over ``frames`` frames of a stream: questions every
    ``_STREAM_ASK_EVERY`` frames; each earlier answer right with ``_STREAM_RIGHT_ANSWERS``."""
    stream = streams[int(rng.integers(len(streams)))]
    first = int(rng.integers(0, len(stream) - frames + 1))
    shown = stream[first : first + frames]
    gap = float(rng.choice(_FRAME_GAPS_S))
    start = float(rng.uniform(0, 600))
    session = _session_frames(shown, [start + gap * i for i in range(frames)])
    turns: list[TimelineTurn] = []
    cut = 0
    while True:
        step = int(rng.integers(*_STREAM_ASK_EVERY))
        if cut + step >= frames:
            break
        seen = shown[cut + step - 1].colour
        past_kind = str(rng.choice(["naming", "yes", "no"]))
        question, answer, _ = _question(rng, past_kind, seen)
        if rng.random() > _STREAM_RIGHT_ANSWERS:  # an answer that was wrong, or about another moment
            answer = str(rng.choice([*COLOURS] if past_kind == "naming" else ["yes", "no"]))
        turns.append(TimelineTurn.of(session[cut : cut + step], question, answer_text(answer, family)))
        cut += step
    history = []
    for _ in range(int(rng.integers(0, 4)) if rng.random() < 0.3 else 0):
        question, answer, _ = _question(rng, str(rng.choice(["naming", "yes", "no"])), str(rng.choice(COLOURS)))
        history.append(Exchange(question, answer_text(answer, family)))
    newest = shown[-1].colour
    question, answer, asked = _question(rng, kind, newest)
    prompt = render_timeline(
        system_prompt=_SYSTEM_PROMPTS[int(rng.integers(len(_SYSTEM_PROMPTS)))],
        history=history,
        turns=turns,
        open_frames=session[cut:],
        origin=Frame(seq=0, key="origin", data=None, receive_ts_ms=0.0, pts_ms=0.0),
        timestamps=bool(rng.random() < 0.8),
        question=question,
    )
    colours = tuple(f.colour for f in shown)
    return ColourExample(prompt, answer, "naming" if kind == "naming" else "yes_no", newest, colours, asked)

