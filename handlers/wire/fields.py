"""Field types and bounds every wire protocol shares: a frame's id, the longest texts, the
sampling limits, and the ``session.config`` fields other protocols set under ``livesight``.

Each bound is named once here; v1's events, the core's commands and the other codecs' types
all take it from this module.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: A frame id: a short string or a 64-bit integer (it is echoed in acks and errors).
FrameId = Annotated[str, Field(max_length=256)] | Annotated[int, Field(ge=-(2**63), lt=2**63)]

#: The longest system prompt, or per-answer instructions that stand in for it.
MAX_INSTRUCTIONS_CHARS = 20_000
#: The longest question (``video.query``'s ``text``, a Live ``text`` or last user turn).
MAX_QUESTION_CHARS = 20_000
#: The longest text of one conversation item (a message's text, an answer's transcript).
MAX_ITEM_TEXT_CHARS = 20_000

#: The most tokens an answer may ask for (the server may lower it further: ``max_answer_tokens``).
MAX_ANSWER_TOKENS = 4096
#: The smallest non-zero temperature: below it, logits / temperature overflows (vLLM clamps
#: to the same value; the embedded engine's softmax would give NaN).
MIN_TEMPERATURE = 0.01
#: Seeds are 63-bit: every engine's generator takes them (a torch seed over 2^64 fails).
MAX_SEED = 2**63 - 1

#: The ``session.config`` fields that OpenAI Realtime and Gemini Live have no name for: their
#: clients set them under ``session.livesight`` / ``setup.livesight``. Live takes
#: ``speech_rate`` there too (``LIVE_ONLY_FIELDS``): Realtime has its own, ``audio.output.speed``.
LIVESIGHT_FIELDS = (
    "num_frames",
    "max_frames",
    "enable_frame_filter",
    "frame_filter_threshold",
    "frame_timestamps",
    "prefix_warmup",
    "use_audio_in_video",
    "watches",
    "memory",
    "camera_fps",
)
LIVE_ONLY_FIELDS = ("speech_rate",)
