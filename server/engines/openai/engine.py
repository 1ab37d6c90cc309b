"""``OpenAIEngine``: livesight's engine interface over OpenAI-compatible chat servers.

Each answer is one streamed ``/v1/chat/completions`` request. Warmup is the same request over
the prefix, closed as a user turn, for one token: the server caches every block up to the last
frame, which is what the next query shares with it. A session paces its warm requests
(``Capabilities.warm_interval_s``, from ``max_warmups_per_s``). A check (yes or no, from the first answer token) is the same request as a
question's, not streamed, for one token with its top log probabilities.

Each frame crosses to a replica once: later requests name it by ``uuid`` alone (see
``messages``). A replica that lost an image (it restarted, or its cache evicted it) answers
400 "Cache miss ..."; the request is then sent once more with every image's data and the
replica's set starts afresh. One that misses three times in a row keeps no images at all (its
multimodal cache is off) and from then on gets every image's data. Servers that cannot take uuid-only
images (SGLang, older vLLM) need ``image_references`` off (the ``openai_image_references``
setting).

Failures are retried where a retry can succeed and nowhere else: a pooled connection the
server closed as it was reused, a request the server failed before any output (vLLM asks for
that retry when its front end and engine core disagree about cached images), and a request
whose replica turned out to be down (it goes to the next one). Closing a stream closes its
connection, which makes vLLM abort the request, so an interrupted answer leaves nothing running.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict, replace
from typing import Any

import anyio
import httpx

from server.engines.base import Capabilities, CheckResult, Engine, EngineError, EngineEvent, Finished, Prompt, Sampling
from server.engines.openai import replicas
from server.engines.openai.messages import Body, DataUrls, chat_body
from server.engines.openai.replicas import Replica, ReplicaDown, replica_base
from server.engines.openai.stream import FINISH_REASONS, choice_events, error_text, first_token_logprobs, sse_chunks
from server.engines.openai.usage import RemoteStats, ReplicaStats, Traffic, remote_usage
from server.engines.yes_no import answer_kind, check_concurrently, yes_probability_of_logprobs

log = logging.getLogger("livesight.engines")

_CONNECT_TIMEOUT_S = 5.0
#: A check's top log probabilities of the first answer token (OpenAI's and vLLM's most by default).
TOP_LOGPROBS = 20


class _ServerFailure(EngineError):
    """The server failed a request on its side (5xx or an error event): worth one retry."""


class _CacheMiss(EngineError):
    """The server does not hold an image the request named by uuid alone."""


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
        max_images: int | None = None,
        image_references: bool = True,
        max_warmups_per_s: float = 2.0,
        session_headers: tuple[str, ...] = ("X-Session-ID",),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.replicas = [Replica(replica_base(u)) for u in dict.fromkeys(urls)]
        self.model = model
        self.health_interval_s = health_interval_s
        self.audio_output = audio_output
        self.image_references = image_references
        self.session_headers = tuple(session_headers)
        if max_warmups_per_s <= 0:
            raise ValueError("max_warmups_per_s must be positive")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=_CONNECT_TIMEOUT_S)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._data_urls = DataUrls()
        self._live = 0
        self.traffic = Traffic()
        self.capabilities = Capabilities(
            name="openai", model=model or "", warm_prefix=True, audio_output=audio_output,
            max_image_side=max_image_side, token_probabilities=True, max_images=max_images,
            warm_interval_s=1.0 / max_warmups_per_s,  # the session paces its warm requests by it
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Check the replicas and learn the model name if none was given.

        Raises ``EngineError`` when no model name is configured and no replica can tell it.
        """
        self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout, transport=self._transport)
        await replicas.check_all(self._client, self.replicas)
        up = [r.base for r in self.replicas if r.healthy]
        if self.model is None:
            self.model = await replicas.discover_model(self._client, self.replicas)
        if not up:
            log.warning("openai engine: no replica is healthy yet (%s)", ", ".join(r.base for r in self.replicas))
        self.capabilities = replace(self.capabilities, model=self.model)
        log.info("openai engine: model %s on %d replica(s), %d healthy", self.model, len(self.replicas), len(up))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    async def release(self, session_id: str) -> None:
        """The session ended: forget the images it sent each replica."""
        for replica in self.replicas:
            replica.release(session_id)

    def stats(self) -> RemoteStats:
        """The replicas' health, the requests in flight and what has been sent (counters since start)."""
        return RemoteStats(
            running_requests=self._live,
            replicas=[ReplicaStats(url=r.base, healthy=r.healthy, held_images=r.held_images) for r in self.replicas],
            **asdict(self.traffic),
        )

    # ------------------------------------------------------------------ requests
    async def prefill(self, session_id: str, prompt: Prompt) -> int:
        """A one-token request over the prefix; returns its prompt length in tokens. The session
        paces these (``Capabilities.warm_interval_s``)."""
        _, answer = await self._complete(session_id, prompt, {}, work="warm")
        return int((answer.get("usage") or {}).get("prompt_tokens") or 0)

    async def check(self, session_id: str, request_id: str, prompts: list[Prompt]) -> list[CheckResult]:
        """How likely each prompt's answer starts with yes; see ``Engine.check``.

        One chat completion per prompt (``{request_id}-{index}``), all sent at once: the messages
        a question would send, for one token, with the first token's ``TOP_LOGPROBS`` top log
        probabilities. The yes and no words among those tokens' texts give the probability; a
        token outside the top ones counts as nothing (0.5 when neither word is among them).
        ``cached_tokens`` is the server's ``prompt_tokens_details.cached_tokens`` (vLLM sends it
        with ``--enable-prompt-tokens-details``). A server that returns no log probabilities
        (one that does not support them) fails the check with ``EngineError``, as does any
        other failure; cancelling closes the requests' connections.
        """
        return await check_concurrently(
            prompts, lambda index, prompt: self._check_one(session_id, f"{request_id}-{index}", prompt)
        )

    async def _check_one(self, session_id: str, request_id: str, prompt: Prompt) -> CheckResult:
        extra = {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
        replica, answer = await self._complete(session_id, prompt, extra, request_id, work="check")
        tops = first_token_logprobs(answer)
        if tops is None:
            raise EngineError(f"{replica.base} returned no token probabilities (logprobs) for a check")
        probability = yes_probability_of_logprobs(
            (lp for token, lp in tops if answer_kind(token) == "yes"),
            (lp for token, lp in tops if answer_kind(token) == "no"),
        )
        usage = remote_usage(answer.get("usage") or {}, prompt)
        return CheckResult(probability, usage.prompt_tokens, usage.cached_tokens)

    async def _complete(
        self, session_id: str, prompt: Prompt, extra: dict[str, Any], request_id: str | None = None, *, work: str,
    ) -> tuple[Replica, dict[str, Any]]:
        """One chat completion for one token, not streamed; returns the replica that answered
        and its answer (``work``: what it is for, in the counters). Sent once more where
        ``generate`` would be. Raises ``EngineError``."""
        sampling = Sampling(temperature=0.0, max_tokens=1)
        extra = {"stream": False, **extra}
        replica = await self._pick(session_id)
        self._live += 1
        try:
            try:
                response = await self._open(replica, session_id, prompt, sampling, extra, stream=False,
                                            request_id=request_id)
            except (_ServerFailure, ReplicaDown):  # see generate
                replica = await self._pick(session_id)
                response = await self._open(replica, session_id, prompt, sampling, extra, stream=False,
                                            request_id=request_id)
        finally:
            self._live -= 1
        try:
            answer = response.json()
        except ValueError as exc:
            raise EngineError(f"{replica.base} sent a malformed answer") from exc
        if not isinstance(answer, dict):
            raise EngineError(f"{replica.base} sent a malformed answer")
        self.traffic.count_prompt(answer.get("usage") or {}, work)
        return replica, answer

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
                    async with aclosing(self._events(replica, session_id, prompt, sampling, extra, request_id)) as events:
                        async for event in events:
                            produced = True
                            yield event
                    return
                except (_ServerFailure, ReplicaDown) as exc:
                    if produced or attempt:
                        raise
                    log.info("%s failed request %s before any output (%s); sending it again", replica.base,
                             request_id, exc)
                    replica = await self._pick(session_id)
        finally:
            self._live -= 1

    async def _events(
        self, replica: Replica, session_id: str, prompt: Prompt, sampling: Sampling, extra: dict[str, Any],
        request_id: str,
    ) -> AsyncIterator[EngineEvent]:
        """One streamed request: its text and audio, then ``Finished``. Raises ``EngineError``."""
        reason: str | None = None
        usage: dict[str, Any] = {}
        response = await self._open(replica, session_id, prompt, sampling, extra, stream=True, request_id=request_id)
        try:
            async for chunk in sse_chunks(response):
                if chunk.get("error"):
                    raise _ServerFailure(f"{replica.base} failed the request: {error_text(chunk['error'])}")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    for event in choice_events(choice, chunk.get("modality")):
                        yield event
                    reason = choice.get("finish_reason") or reason
        except httpx.HTTPError as exc:
            raise await replicas.failure(self._client, replica, exc) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # a closed connection makes the server abort the request
        if reason is None:
            raise EngineError(f"{replica.base} ended the stream without finishing the answer")
        self.traffic.count_prompt(usage, "answer")
        yield Finished(FINISH_REASONS.get(reason, "stop"), remote_usage(usage, prompt))

    async def _open(
        self,
        replica: Replica,
        session_id: str,
        prompt: Prompt,
        sampling: Sampling,
        extra: dict[str, Any],
        *,
        stream: bool,
        request_id: str | None = None,
    ) -> httpx.Response:
        """Send the session's ``prompt`` to ``replica``, naming the images the session sent it
        by uuid alone.

        Returns the response once its status says it is served; the replica now holds every
        image sent with its data. On a cache miss the session's set is dropped and the request
        goes once more with every image's data. Raises ``EngineError`` (see ``_send``).
        """
        held = replica.held(session_id)
        refer = self.image_references and held.refer
        body = await chat_body(self.model, prompt, sampling, self._data_urls, held if refer else None)
        body.json.update(extra)
        try:
            response = await self._send(replica, session_id, body, stream=stream, request_id=request_id)
            if body.referenced:
                held.misses_in_row = 0
        except _CacheMiss as exc:
            if not body.referenced:
                raise EngineError(str(exc)) from exc
            log.info("%s lost images session %s sent it (%s); sending them again", replica.base, session_id[:8], exc)
            self.traffic.cache_misses += 1
            held.keys.clear()
            held.misses_in_row += 1
            if not held.refer:
                self.traffic.sessions_data_only += 1
                log.warning(
                    "%s did not keep session %s's images between %d requests in a row (a multimodal cache "
                    "off, or a vLLM with --api-server-count above 1 behind it?): that session's requests "
                    "carry every image from now on", replica.base, session_id[:8], held.misses_in_row,
                )
            body = await chat_body(self.model, prompt, sampling, self._data_urls, None)
            body.json.update(extra)
            response = await self._send(replica, session_id, body, stream=stream, request_id=request_id)
        held.remember(body.sent)
        return response

    async def _send(
        self, replica: Replica, session_id: str, body: Body, *, stream: bool, request_id: str | None = None
    ) -> httpx.Response:
        """POST a chat completion; returns the response once its status says it is served.

        Every request carries the session's id in each of ``session_headers`` (a router pins
        the session to one backend by it). A pooled connection that the server closed as it
        was reused is retried once. Raises
        ``_CacheMiss`` for an image named by uuid that the server does not hold, else
        ``EngineError`` (after checking the replica's health when the failure may be its own).
        """
        headers = {"Content-Type": "application/json", **{name: session_id for name in self.session_headers}}
        if request_id:
            headers["X-Request-Id"] = request_id
        content = json.dumps(body.json, separators=(",", ":")).encode()
        for attempt in range(2):
            request = self._client.build_request(
                "POST", replica.api + "/chat/completions", content=content, headers=headers
            )
            self.traffic.count_request(len(content), len(body.sent), body.referenced)
            try:
                response = await self._client.send(request, stream=stream)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if attempt:
                    raise await replicas.failure(self._client, replica, exc) from exc
            except httpx.HTTPError as exc:
                raise await replicas.failure(self._client, replica, exc) from exc
        if response.status_code >= 400:
            detail = await response.aread()
            await response.aclose()
            message = f"{replica.base} answered {response.status_code}: {error_text(detail)}"
            if response.status_code == 400 and "cache miss" in message.lower():
                raise _CacheMiss(message)
            if response.status_code >= 500:
                await replicas.check(self._client, replica)
                raise _ServerFailure(message)
            raise EngineError(message)
        return response

    async def _pick(self, session_id: str) -> Replica:
        """The session's replica (see ``replicas.pick``). Raises ``EngineError`` before ``start``."""
        if self._client is None:
            raise EngineError("engine not started")
        return await replicas.pick(self._client, self.replicas, session_id, self.health_interval_s)
