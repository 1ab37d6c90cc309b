"""``livesight bench live``: one Gemini Live session for a long time, through the google-genai SDK.

A ``livesight serve`` process over TLS (a self-signed certificate made for the run) and one
SDK session (``client.aio.live.connect``) that streams camera frames at ``fps`` (real footage,
the bikes clip, looped) for ``minutes``, with a typed question every ``ask_every_s``. For each
question: the time to its first model turn part (at the client, from
``send_client_content``), the prompt's tokens and the share served from the cache
(``usageMetadata``), and the server process's RSS. It prints them, then the last minute's
time to first output against the first's and the RSS growth: what "a camera session that
runs for hours" needs to stay flat.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from server.background import serve_process
from server.bench.process import rss_bytes
from server.bench.served import serve_args
from server.bench.tls import self_signed

QUESTION = "What is happening now?"


@dataclass
class Asked:
    """One question of the session."""

    at_s: float  # since the session started
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int
    rss_mb: float

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _footage(count: int) -> list[bytes]:
    from server.bench.footage import load_footage

    return [base64.b64decode(b64) for b64 in load_footage(count, size=(320, 240))]


async def _session(base_url: str, pid: int, minutes: float, fps: float, ask_every_s: float,
                   max_tokens: int) -> list[Asked]:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="bench", http_options={"base_url": base_url})
    config = {"response_modalities": ["TEXT"], "max_output_tokens": max_tokens, "temperature": 0.0}
    pictures = _footage(120)
    asked: list[Asked] = []
    async with client.aio.live.connect(model="livesight", config=config) as session:
        started = time.monotonic()
        end = started + minutes * 60

        async def camera() -> None:
            n = 0
            while time.monotonic() < end:
                jpeg = pictures[n % len(pictures)]
                await session.send_realtime_input(video=types.Blob(data=jpeg, mime_type="image/jpeg"))
                n += 1
                await asyncio.sleep(max(0.0, started + n / fps - time.monotonic()))

        sender = asyncio.create_task(camera())
        try:
            next_ask = started + ask_every_s
            while next_ask < end:
                await asyncio.sleep(max(0.0, next_ask - time.monotonic()))
                next_ask += ask_every_s
                sent = time.perf_counter()
                await session.send_client_content(
                    turns=types.Content(role="user", parts=[types.Part(text=QUESTION)]), turn_complete=True
                )
                first = None
                usage = None
                async for message in session.receive():
                    if first is None and message.server_content and message.server_content.model_turn:
                        first = time.perf_counter()
                    usage = message.usage_metadata or usage
                if usage is None or first is None:
                    continue
                images = sum(d.token_count for d in usage.prompt_tokens_details or []
                             if d.modality == types.MediaModality.IMAGE)
                asked.append(Asked(
                    round(time.monotonic() - started, 1), (first - sent) * 1000, usage.prompt_token_count,
                    usage.cached_content_token_count or 0, images, rss_bytes(pid) / 2**20,
                ))
                a = asked[-1]
                print(f"{a.at_s:7.1f} s  ttft {a.ttft_ms:7.1f} ms  prompt {a.prompt_tokens:6d}  "
                      f"cached {a.cached_share:6.1%}  image tokens {a.image_tokens:6d}  server RSS {a.rss_mb:7.1f} MiB",
                      flush=True)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return asked


def run_live(model: str | None, minutes: float, fps: float, ask_every_s: float, max_tokens: int = 16) -> list[Asked]:
    """Run the bench; prints each question's figures and the summary; returns them."""
    with tempfile.TemporaryDirectory() as folder:
        cert, key = self_signed(Path(folder))
        args = serve_args(model, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
        os.environ["SSL_CERT_FILE"] = str(cert)  # the SDK reads it when its client is made
        with serve_process(args, tls_ca=cert) as served:
            base_url = f"https://{served.host}:{served.port}"
            print(f"bench live: {minutes:g} min at {fps:g} fps, a question every {ask_every_s:g} s, "
                  f"{max_tokens} answer tokens", flush=True)
            asked = asyncio.run(_session(base_url, served.proc.pid, minutes, fps, ask_every_s, max_tokens))
    _summary(asked, ask_every_s)
    return asked


def _summary(asked: list[Asked], ask_every_s: float) -> None:
    if len(asked) < 2:
        print("too few questions for a comparison")
        return
    per_minute = max(1, round(60 / ask_every_s))
    first = statistics.median(a.ttft_ms for a in asked[:per_minute])
    last = statistics.median(a.ttft_ms for a in asked[-per_minute:])
    print(f"questions: {len(asked)}; ttft first minute {first:.1f} ms, last minute {last:.1f} ms "
          f"(x{last / first:.2f}); median cached share {statistics.median(a.cached_share for a in asked):.1%}")
    print(f"server RSS: {asked[0].rss_mb:.1f} MiB at the first question, {asked[-1].rss_mb:.1f} MiB at the last "
          f"(max {max(a.rss_mb for a in asked):.1f}); image tokens per prompt "
          f"{min(a.image_tokens for a in asked)}-{max(a.image_tokens for a in asked)}")
