"""The remote engine: any OpenAI-compatible chat server (vLLM, vLLM-Omni, SGLang) over HTTP.

Each answer is one streamed ``/v1/chat/completions`` request. Frames travel as data URLs of
the client's own bytes (no re-encode; a frame without them is encoded as JPEG once) with the
frame's content key as the part's ``uuid``, which vLLM uses as the image's cache identity.
Warmup is the same request over the prefix, closed as a user turn, for one token: the server
caches every block up to the last frame, which is what the next query shares with it. A
session's warm requests are paced by a ``WarmCadence``.

Each frame crosses to a replica once. The engine remembers, per replica, which content keys it
has sent there (keys are content hashes, so the set is shared by all sessions); later requests
name those images by ``uuid`` alone (``"image_url": null``), which vLLM serves from its
multimodal cache without receiving, decoding or processing the image again. A replica that
lost an image (it restarted, or its cache evicted it) answers 400 "Cache miss ..."; the
request is then sent once more with every image's data and the replica's set starts afresh.
The set is also dropped whenever the replica's health changes (it may have restarted), so a
session that fails over to another replica, or comes back to a restarted one, starts afresh.
Servers that cannot take uuid-only images (SGLang, older vLLM) need ``image_references`` off
(the ``openai_image_references`` setting).

Several replicas may serve one model. A session always goes to the same one, chosen by
rendezvous hashing of its id (so its prefix stays warm there, and only the sessions of a
replica that goes away move); a replica whose health check fails is skipped until it passes
again, and a failed request triggers a check. Closing a stream closes its connection, which
makes vLLM abort the request.

Text arrives as ``delta.content``; speech as OpenAI's ``delta.audio.data`` (base64 PCM16 at
24 kHz, or WAV) or as vLLM-Omni's chunks with ``"modality": "audio"`` whose ``delta.content``
is a base64 WAV. Both become ``AudioChunk``s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import logging
import math
import re
import time
import wave
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from PIL import Image

from server.engines.base import (
    AudioChunk,
    Capabilities,
    Engine,
    EngineError,
    EngineEvent,
    Finished,
    ImageSegment,
    Prompt,
    Sampling,
    TextDelta,
    TextSegment,
    Usage,
)
from server.engines.warm_cadence import WarmCadence

log = logging.getLogger("livesight.engines")

AUDIO_RATE = 24_000  # what OpenAI's pcm16 audio deltas (and vLLM-Omni's speech) use
_HEALTH_TIMEOUT_S = 3.0
_CONNECT_TIMEOUT_S = 5.0
_DATA_URL_CACHE = 512
CHARS_PER_TOKEN = 4  # text length estimate where the server's tokenizer is not at hand
MARKUP_TOKENS_PER_MESSAGE = 4  # a chat template's role markers around each message, estimated
_HELD_KEYS = 8192  # content keys remembered per replica (a forgotten one is only sent again)
_MISSES_BEFORE_DATA_ONLY = 3  # cache misses in a row after which a replica gets every image's data
_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "tool_calls": "stop", "content_filter": "stop"}


class _ServerFailure(EngineError):
    """The server failed a request on its side (5xx or an error event): worth one retry."""


class _ReplicaDown(EngineError):
    """The replica could not be reached and its health check failed: another may serve."""


class _CacheMiss(EngineError):
    """The server does not hold an image the request named by uuid alone."""


@dataclass
class Replica:
    """One server: its API root (``.../v1``), what its last health check said, and the
    content keys of the images it has been sent (and so holds, unless it lost them)."""

    base: str
    healthy: bool = True
    checked_at: float = -math.inf
    held: OrderedDict[str, None] = field(default_factory=OrderedDict, repr=False)
    misses_in_row: int = 0  # requests naming images by uuid that it could not serve, in a row

    @property
    def api(self) -> str:
        return self.base + "/v1"

    @property
    def keeps_images(self) -> bool:
        """False once it missed every time in a row: it keeps no images between requests (a
        server with its multimodal cache off), so naming them would only double each request."""
        return self.misses_in_row < _MISSES_BEFORE_DATA_ONLY

    def holds(self, key: str) -> bool:
        """True when the image ``key`` was sent here (since the set was last dropped)."""
        if key in self.held:
            self.held.move_to_end(key)
            return True
        return False

    def remember(self, keys: Iterable[str]) -> None:
        """Note images the replica accepted with their data."""
        for key in keys:
            self.held[key] = None
            self.held.move_to_end(key)
        while len(self.held) > _HELD_KEYS:
            self.held.popitem(last=False)

    def forget(self) -> None:
        """Drop the set: every image goes with its data again until the replica accepts it."""
        self.held.clear()


@dataclass
class _Body:
    """A request body and how its images travel: keys sent with data, and images named only."""

    json: dict[str, Any]
    sent: list[str]
    referenced: int


def replica_base(url: str) -> str:
    """The server root of ``url`` (``http://host:8000`` from ``http://host:8000/v1/``)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def rendezvous_order(session_id: str, replicas: Iterable[Replica]) -> list[Replica]:
    """Replicas from most to least preferred for ``session_id`` (highest random weight first)."""

    def weight(replica: Replica) -> bytes:
        return hashlib.blake2b(f"{session_id}|{replica.base}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


class OpenAIEngine(Engine):
    """Streams answers from OpenAI-compatible chat servers."""

    def __init__(
        self,
        urls: list[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        health_interval_s: float = 5.0,
        audio_output: bool = False,
        max_image_side: int = 1024,
        image_references: bool = True,
        max_warmups_per_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.replicas = [Replica(replica_base(u)) for u in dict.fromkeys(urls)]
        self.model = model
        self.health_interval_s = health_interval_s
        self.audio_output = audio_output
        self.image_references = image_references
        self._cadence = WarmCadence(max_warmups_per_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=_CONNECT_TIMEOUT_S)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._data_urls: OrderedDict[str, str] = OrderedDict()
        self._live = 0
        self.traffic = {"requests": 0, "request_bytes": 0, "images_sent": 0, "images_referenced": 0, "cache_misses": 0,
                        "prompt_tokens": 0}
        self.capabilities = Capabilities(
            name="openai", model=model or "", warm_prefix=True, audio_output=audio_output, max_image_side=max_image_side
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Check the replicas and learn the model name if none was given.

        Raises ``EngineError`` when no model name is configured and no replica can tell it.
        """
        self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout, transport=self._transport)
        with anyio.move_on_after(2 * _HEALTH_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                for replica in self.replicas:
                    tg.start_soon(self._check, replica)
        up = [r.base for r in self.replicas if r.healthy]
        if self.model is None:
            self.model = await self._discover_model()
        if not up:
            log.warning("openai engine: no replica is healthy yet (%s)", ", ".join(r.base for r in self.replicas))
        self.capabilities = Capabilities(
            name="openai", model=self.model, warm_prefix=True, audio_output=self.audio_output,
            max_image_side=self.capabilities.max_image_side,
        )
        log.info("openai engine: model %s on %d replica(s), %d healthy", self.model, len(self.replicas), len(up))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    def stats(self) -> dict[str, object]:
        """The replicas' health, the requests in flight and what has been sent (counters since start)."""
        return {
            "running_requests": self._live,
            "replicas": [{"url": r.base, "healthy": r.healthy, "held_images": len(r.held)} for r in self.replicas],
            **self.traffic,
        }

    # ------------------------------------------------------------------ requests
    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        """A one-token request over the prefix; returns its prompt length in tokens.

        Paced: it returns no sooner than the session's warm cadence allows the next one.
        """
        async with self._cadence.slot():
            return await self._warm(session_id, prompt)

    async def _warm(self, session_id: str, prompt: Prompt) -> int:
        sampling = Sampling(temperature=0.0, max_tokens=1)
        replica = await self._pick(session_id)
        self._live += 1
        try:
            try:
                response = await self._open(replica, prompt, sampling, {"stream": False}, stream=False)
            except (_ServerFailure, _ReplicaDown):  # see generate
                replica = await self._pick(session_id)
                response = await self._open(replica, prompt, sampling, {"stream": False}, stream=False)
        finally:
            self._live -= 1
        try:
            usage = response.json().get("usage") or {}
        except (ValueError, AttributeError) as exc:
            raise EngineError(f"{replica.base} sent a malformed answer") from exc
        tokens = int(usage.get("prompt_tokens") or 0)
        self.traffic["prompt_tokens"] += tokens
        return tokens

    async def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        """Stream the answer; see ``Engine.generate``.

        A request the server fails before any output (a 5xx, or an error event first) is sent
        once more: vLLM fails a request that way, asking for a retry, when its front end and
        engine core disagree about which images are cached (after an aborted request). One
        whose replica turns out to be down is sent once to the next healthy replica.
        """
        extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
        if self.audio_output:
            extra["modalities"] = ["text", "audio"]
        replica = await self._pick(session_id)
        self._live += 1
        try:
            for attempt in range(2):
                produced = False
                try:
                    async with aclosing(self._events(replica, prompt, sampling, extra, request_id)) as events:
                        async for event in events:
                            produced = True
                            yield event
                    return
                except (_ServerFailure, _ReplicaDown) as exc:
                    if produced or attempt:
                        raise
                    log.info("%s failed request %s before any output (%s); sending it again", replica.base,
                             request_id, exc)
                    replica = await self._pick(session_id)
        finally:
            self._live -= 1

    async def _events(
        self, replica: Replica, prompt: Prompt, sampling: Sampling, extra: dict[str, Any], request_id: str
    ) -> AsyncIterator[EngineEvent]:
        """One streamed request: its text and audio, then ``Finished``. Raises ``EngineError``."""
        reason: str | None = None
        usage: dict[str, Any] = {}
        response = await self._open(replica, prompt, sampling, extra, stream=True, request_id=request_id)
        try:
            async for chunk in _sse_chunks(response):
                if chunk.get("error"):
                    raise _ServerFailure(f"{replica.base} failed the request: {_error_text(chunk['error'])}")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    for event in _choice_events(choice, chunk.get("modality")):
                        yield event
                    reason = choice.get("finish_reason") or reason
        except httpx.HTTPError as exc:
            raise await self._failure(replica, exc) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # a closed connection makes the server abort the request
        if reason is None:
            raise EngineError(f"{replica.base} ended the stream without finishing the answer")
        self.traffic["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
        yield Finished(_FINISH.get(reason, "stop"), remote_usage(usage, prompt))

    async def _open(
        self,
        replica: Replica,
        prompt: Prompt,
        sampling: Sampling,
        extra: dict[str, Any],
        *,
        stream: bool,
        request_id: str | None = None,
    ) -> httpx.Response:
        """Send ``prompt`` to ``replica``, naming the images it holds by uuid alone.

        Returns the response once its status says it is served; the replica now holds every
        image sent with its data. On a cache miss the replica's set is dropped and the request
        goes once more with every image's data. Raises ``EngineError`` (see ``_send``).
        """
        refer = self.image_references and replica.keeps_images
        body = await self._body(prompt, sampling, replica if refer else None)
        body.json.update(extra)
        try:
            response = await self._send(replica, body, stream=stream, request_id=request_id)
            if body.referenced:
                replica.misses_in_row = 0
        except _CacheMiss as exc:
            if not body.referenced:
                raise EngineError(str(exc)) from exc
            log.info("%s lost images it was sent (%s); sending them again", replica.base, exc)
            self.traffic["cache_misses"] += 1
            replica.forget()
            replica.misses_in_row += 1
            if not replica.keeps_images:
                log.warning("%s keeps no images between requests (its multimodal cache is off?): every "
                            "request to it carries every image from now on", replica.base)
            body = await self._body(prompt, sampling, None)
            body.json.update(extra)
            response = await self._send(replica, body, stream=stream, request_id=request_id)
        replica.remember(body.sent)
        return response

    async def _send(
        self, replica: Replica, body: _Body, *, stream: bool, request_id: str | None = None
    ) -> httpx.Response:
        """POST a chat completion; returns the response once its status says it is served.

        A pooled connection that the server closed as it was reused is retried once. Raises
        ``_CacheMiss`` for an image named by uuid that the server does not hold, else
        ``EngineError`` (after checking the replica's health when the failure may be its own).
        """
        headers = {"Content-Type": "application/json"}
        if request_id:
            headers["X-Request-Id"] = request_id
        content = json.dumps(body.json, separators=(",", ":")).encode()
        for attempt in range(2):
            request = self._client.build_request(
                "POST", replica.api + "/chat/completions", content=content, headers=headers
            )
            self.traffic["requests"] += 1
            self.traffic["request_bytes"] += len(content)
            self.traffic["images_sent"] += len(body.sent)
            self.traffic["images_referenced"] += body.referenced
            try:
                response = await self._client.send(request, stream=stream)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if attempt:
                    raise await self._failure(replica, exc) from exc
            except httpx.HTTPError as exc:
                raise await self._failure(replica, exc) from exc
        if response.status_code >= 400:
            detail = await response.aread()
            await response.aclose()
            message = f"{replica.base} answered {response.status_code}: {_error_text(detail)}"
            if response.status_code == 400 and "cache miss" in message.lower():
                raise _CacheMiss(message)
            if response.status_code >= 500:
                await self._check(replica)
                raise _ServerFailure(message)
            raise EngineError(message)
        return response

    # ------------------------------------------------------------------ replicas
    async def _pick(self, session_id: str) -> Replica:
        """The session's replica: the most preferred one that is healthy.

        Raises ``EngineError`` when none is.
        """
        if self._client is None:
            raise EngineError("engine not started")
        for replica in rendezvous_order(session_id, self.replicas):
            # A healthy replica is trusted until a request to it fails, which checks it at once
            # (no check on the way to the first token); a failed one is checked again once its
            # last check is stale.
            if not replica.healthy and time.monotonic() - replica.checked_at > self.health_interval_s:
                await self._check(replica)
            if replica.healthy:
                return replica
        raise EngineError("no healthy server: " + ", ".join(r.base for r in self.replicas))

    async def _check(self, replica: Replica) -> None:
        """Health check: ``/health`` (vLLM, SGLang), else ``/v1/models`` (any OpenAI server)."""
        healthy = False
        try:
            with anyio.fail_after(_HEALTH_TIMEOUT_S):
                response = await self._client.get(replica.base + "/health")
                if response.status_code in (404, 405):
                    response = await self._client.get(replica.api + "/models")
                healthy = response.status_code == 200
        except (httpx.HTTPError, TimeoutError) as exc:
            log.debug("health check of %s failed: %s", replica.base, exc)
        if healthy != replica.healthy:
            log.warning("replica %s is %s", replica.base, "back" if healthy else "down")
            replica.forget()  # down or back: it may have restarted with an empty cache
            replica.misses_in_row = 0  # ... and perhaps with other options
        replica.healthy = healthy
        replica.checked_at = time.monotonic()

    async def _failure(self, replica: Replica, exc: httpx.HTTPError) -> EngineError:
        """A transport error: the replica is checked now, so a dead one is skipped from here on."""
        await self._check(replica)
        if not replica.healthy:
            return _ReplicaDown(f"{replica.base}: {type(exc).__name__}: {exc}")
        return EngineError(f"{replica.base}: {type(exc).__name__}: {exc}")

    async def _discover_model(self) -> str:
        for replica in self.replicas:
            if not replica.healthy:
                continue
            try:
                response = await self._client.get(replica.api + "/models")
                models = response.json().get("data") or []
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            if models and isinstance(models[0], dict) and models[0].get("id"):
                return str(models[0]["id"])
        raise EngineError("no server could name its model; set model (LIVESIGHT_MODEL) to the served model name")

    # ------------------------------------------------------------------ request bodies
    async def _body(self, prompt: Prompt, sampling: Sampling, holder: Replica | None) -> _Body:
        """The chat completion request for ``prompt`` (an open turn is sent closed).

        Images that ``holder`` holds are named by uuid alone; the others carry their data
        (with their content key as uuid, so the server can hold them from now on).
        """
        messages = []
        sent: list[str] = []
        referenced = 0
        for turn in prompt.turns:
            parts: list[dict[str, Any]] = []
            for seg in turn.segments:
                if isinstance(seg, TextSegment):
                    parts.append({"type": "text", "text": plain_text(seg.text)})
                elif isinstance(seg, ImageSegment):
                    if holder is not None and holder.holds(seg.key):
                        parts.append({"type": "image_url", "image_url": None, "uuid": seg.key})
                        referenced += 1
                        continue
                    url = await self._data_url(seg)
                    parts.append({"type": "image_url", "image_url": {"url": url}, "uuid": seg.key})
                    sent.append(seg.key)
            if all(p["type"] == "text" for p in parts):
                messages.append({"role": turn.role, "content": "".join(p["text"] for p in parts)})
            else:
                messages.append({"role": turn.role, "content": parts})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return _Body(body, sent, referenced)

    async def _data_url(self, image: ImageSegment) -> str:
        """A data URL of the client's own image bytes (JPEG-encoded once when there are none)."""
        url = self._data_urls.get(image.key)
        if url is None:
            raw = image.jpeg
            if raw is None:
                raw = await anyio.to_thread.run_sync(_encode_jpeg, image)
            url = f"data:{_mime(raw)};base64,{base64.b64encode(raw).decode('ascii')}"
            self._data_urls[image.key] = url
            while len(self._data_urls) > _DATA_URL_CACHE:
                self._data_urls.popitem(last=False)
        else:
            self._data_urls.move_to_end(image.key)
        return url


# ---------------------------------------------------------------------- stream parsing


async def _sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
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


def _choice_events(choice: dict[str, Any], modality: str | None) -> list[EngineEvent]:
    """The text and audio in one streamed choice."""
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


def _mime(raw: bytes) -> str:
    if raw[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if raw[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def _encode_jpeg(image: ImageSegment) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image.pixels()).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _error_text(body: bytes | dict[str, Any] | str) -> str:
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


# What opens a special token's text in the chat formats seen (``<|im_end|>``, ``<|eot_id|>``,
# ``<image>``, ``</s>``, ``<end_of_utterance>``): a remote server's tokenizer is not known here.
_MARKUP_START = re.compile(r"<(?=[|/A-Za-z_])")


def plain_text(text: str) -> str:
    """User text for a remote server: every ``<`` that could open a special token is followed
    by a zero-width space, so the server's tokenizer reads no special token in it."""
    return _MARKUP_START.sub("<\u200b", text)


def remote_usage(usage: dict[str, Any], prompt: Prompt) -> Usage:
    """A remote answer's ``Usage`` from the server's ``usage`` record.

    The server's own ``prompt_tokens_details.image_tokens`` is used when it sends one (vLLM
    does not); otherwise image tokens are estimated as the prompt tokens less an estimate of
    its text (``CHARS_PER_TOKEN`` characters a token, ``MARKUP_TOKENS_PER_MESSAGE`` a message).
    Audio tokens (the spoken words, sent as text) are estimated the same way.
    """
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    texts = [seg.text for turn in prompt.turns for seg in turn.segments if isinstance(seg, TextSegment)]
    has_images = any(isinstance(seg, ImageSegment) for turn in prompt.turns for seg in turn.segments)
    if details.get("image_tokens") is not None:
        images = int(details["image_tokens"])
    elif has_images:
        text_estimate = sum(_estimated_tokens(t) for t in texts) + MARKUP_TOKENS_PER_MESSAGE * len(prompt.turns)
        images = max(0, prompt_tokens - text_estimate)
    else:
        images = 0
    images = min(images, prompt_tokens)
    spoken = min(_estimated_tokens(prompt.spoken) if prompt.spoken else 0, prompt_tokens - images)
    return Usage(
        prompt_tokens, int(details.get("cached_tokens") or 0), int(usage.get("completion_tokens") or 0), images, spoken
    )


def _estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)
