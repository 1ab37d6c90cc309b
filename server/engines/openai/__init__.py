"""The remote engine: any OpenAI-compatible chat server (vLLM, vLLM-Omni, SGLang) over HTTP.

livesight holds no model here; it sends each answer and warm-up as a chat completion to one of
several replicas, and its work is to send as little as it can and to survive a replica that
goes away. The package reads in the order a request takes:

- ``replicas``: which replica serves a session (rendezvous hashing), health checks, and the
  images each replica is believed to hold;
- ``messages``: the request body, with images as data URLs or, when held, by uuid alone;
- ``stream``: the server's stream (SSE, text and two audio dialects) as engine events;
- ``usage``: an answer's ``Usage`` and the traffic counters behind ``stats()``;
- ``engine``: ``OpenAIEngine``, which ties them together and owns the retries.

``engine`` owns the one HTTP client: ``replicas`` is lent it for health checks and ``stream``
reads the responses it gets; ``messages`` and ``usage`` are plain functions and records that a
test can drive without a server.
"""

from server.engines.openai.engine import OpenAIEngine

__all__ = ["OpenAIEngine"]
