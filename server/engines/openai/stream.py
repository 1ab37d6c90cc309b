"""What a server sends back, as livesight's engine events (and a check's log probabilities).

The servers differ in how they speak: text arrives as ``delta.content``; speech as OpenAI's
``delta.audio`` (base64 PCM16 at 24 kHz, or WAV, with an optional transcript) or as
vLLM-Omni's chunks with ``"modality": "audio"`` whose ``delta.content`` is a base64 WAV. All of
it is normalised here, at the boundary, so the engine yields only ``TextDelta`` and
``AudioChunk`` (always a complete WAV) and maps the server's finish reasons onto livesight's
three. Malformed data is an ``EngineError``; a server's error body is cut down to a short
description that is safe to log (it may be long, or echo the request).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import wave
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx

from server.engines.base import AudioChunk, EngineError, EngineEvent, TextDelta

AUDIO_RATE = 24_000  # what OpenAI's pcm16 audio deltas (and vLLM-Omni's speech) use
FINISH_REASONS: dict[str, Literal["stop", "length", "abort"]] = {
    "stop": "stop", "length": "length", "abort": "abort", "tool_calls": "stop", "content_filter": "stop",
}


async def sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to ``[DONE]``.

    Raises ``EngineError`` for data that is not a JSON object.
    """
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # comments, event names, keep-alives, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise EngineError("the server streamed malformed JSON") from exc
        if not isinstance(chunk, dict):
            raise EngineError("the server streamed a non-object chunk")
        yield chunk


def choice_events(choice: dict[str, Any], modality: str | None) -> list[EngineEvent]:
    """The text and audio in one streamed choice. Raises ``EngineError`` for audio that is not base64."""
    delta = choice.get("delta") or {}
    events: list[EngineEvent] = []
    content = delta.get("content")
    if modality == "audio":  # vLLM-Omni: the content is a base64 WAV
        if content:
            events.append(AudioChunk(_as_wav(_b64decode(content))))
        return events
    if content:
        events.append(TextDelta(content))
    audio = delta.get("audio")
    if isinstance(audio, dict):
        if audio.get("transcript"):
            events.append(TextDelta(audio["transcript"]))
        if audio.get("data"):
            events.append(AudioChunk(_as_wav(_b64decode(audio["data"]))))
    return events


def first_token_logprobs(answer: dict[str, Any]) -> list[tuple[str, float]] | None:
    """A non-streamed chat completion's top log probabilities of its first token, as (token text,
    log probability) pairs (``choices[0].logprobs.content[0].top_logprobs``); None when the
    answer has none. Raises ``EngineError`` for entries that are not a text and a number."""
    choices = answer.get("choices") or []
    logprobs = (choices[0].get("logprobs") if choices and isinstance(choices[0], dict) else None) or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content or not isinstance(content[0], dict) or not content[0].get("top_logprobs"):
        return None
    try:
        return [(str(entry["token"]), float(entry["logprob"])) for entry in content[0]["top_logprobs"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError("the server sent malformed log probabilities") from exc


def error_text(body: bytes | dict[str, Any] | str) -> str:
    """A short, log-safe description of a server's error body."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = json.loads(body)
        except ValueError:
            return body[:200].decode("utf-8", "replace")
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        return str(message or body)[:300]
    return str(body)[:300]


def _b64decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise EngineError("the server streamed audio that is not base64") from exc


def _as_wav(audio: bytes) -> bytes:
    """WAV bytes as they are; raw PCM16 (OpenAI's pcm16 deltas) wrapped at 24 kHz mono."""
    if audio[:4] == b"RIFF":
        return audio
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(AUDIO_RATE)
        out.writeframes(audio[: len(audio) // 2 * 2])
    return buf.getvalue()
