"""``livesight bench ttft --conversation``: time to first output over a whole conversation.

For each frame count N, one session buffers N distinct frames and waits until the server is
idle (decodes and warmup done), then:

1. asks a first question;
2. asks follow-ups the moment each answer ends (``response.done``), with no pause at all;
3. sends new frames at 2 fps and asks the moment the last one is acknowledged (the question
   races that frame's decode and warmup), then one more follow-up at once.

A second session with ``prefix_warmup: false`` buffers the same N frames and asks once: the
cold prefill of the same first prompt, measured in the same run. A third (N >= 8) fills its
window (``max_frames`` = N), asks once, then sends one more frame, which slides the window
(the embedded engine evicts the oldest frame and moves its warm prefix; an engine that cannot
move one evicts the oldest half and warms the rest again), and asks the moment that frame is
acknowledged: the question races the slide (column ``rewarm_race_ms``). It is compared with a
cold prefill of a prompt that long, estimated from the cold session's time per token. Times are measured at the
client, from sending ``video.query`` to the first ``video.frames.consumed`` or text delta.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx

from server.background import RunningServer, run_server
from server.bench.footage import bench_frame
from server.bench.served import wait_idle
from server.client.connection import Connection
from server.settings import Settings

ANSWER_TOKENS = 16
NEW_FRAMES = 3
FRAME_INTERVAL_S = 0.5  # 2 fps


@dataclass
class Ask:
    """One question: client-side time to first output and the prompt's cache use."""

    kind: str  # first, follow-up, after-frames, cold
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class Conversation:
    frames: int
    asks: list[Ask] = field(default_factory=list)

    def of(self, kind: str) -> list[Ask]:
        return [a for a in self.asks if a.kind == kind]

    def median(self, kind: str) -> float:
        return statistics.median(a.ttft_ms for a in self.of(kind))

    def min_share(self, kind: str) -> float:
        return min(a.cached_share for a in self.of(kind))


class _Client:
    """A session that sends numbered frames and times questions."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent = 0

    async def frames(self, count: int, start: int, interval_s: float = 0.0) -> None:
        for i in range(start, start + count):
            await self.conn.send_frame(bench_frame(i), frame_id=i, pts_ms=i * 500)
            await self.conn.wait_acks(1)
            if interval_s and i < start + count - 1:
                await asyncio.sleep(interval_s)

    async def ask(self, kind: str) -> Ask:
        self.sent += 1
        answer = await self.conn.ask_timed(f"What changed, and where? ({self.sent})")
        usage = answer.done.usage
        return Ask(kind, answer.first_output_ms, usage.prompt_tokens, usage.cached_tokens)


@asynccontextmanager
async def _session(
    server: RunningServer, frames: int, warm: bool, window: int | None = None
) -> AsyncIterator[_Client]:
    window = window or min(frames + 2 * NEW_FRAMES + 2, 128)
    conn, _ = await Connection.open(server.ws_url, {
        "prefix_warmup": warm, "enable_frame_filter": False, "max_frames": window, "num_frames": window,
        "sampling": {"temperature": 0, "max_tokens": ANSWER_TOKENS}, "frame_timestamps": True,
    })
    try:
        yield _Client(conn)
    finally:
        await conn.close()


async def converse(server: RunningServer, frames: int, follow_ups: int = 3) -> Conversation:
    """One warm conversation over ``frames`` buffered frames, then the cold first question."""
    result = Conversation(frames)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        async with _session(server, frames, warm=True) as client:
            await client.frames(frames, 0)
            await wait_idle(http)
            result.asks.append(await client.ask("first"))
            for _ in range(follow_ups):
                result.asks.append(await client.ask("follow-up"))
            for round_ in range(2):
                await client.frames(NEW_FRAMES, frames + round_ * NEW_FRAMES, FRAME_INTERVAL_S)
                result.asks.append(await client.ask("after-frames"))
                result.asks.append(await client.ask("follow-up"))
        await wait_idle(http)
        async with _session(server, frames, warm=False) as client:
            await client.frames(frames, 0)
            await wait_idle(http)
            result.asks.append(await client.ask("cold"))
        await wait_idle(http)
        if frames >= 8:
            async with _session(server, frames, warm=True, window=frames) as client:
                await client.frames(frames, 1000)
                await wait_idle(http)
                await client.ask("warm")
                await wait_idle(http)
                await client.frames(1, 1000 + frames)
                result.asks.append(await client.ask("re-warm"))
            await wait_idle(http)
    return result


def render(conversations: list[Conversation]) -> str:
    """The conversation table: medians in ms, the smallest cached share of each kind."""
    lines = [
        "frames  prompt_tok  first_ms  first_cached  follow_ms  follow_cached  new_frames_ms  new_frames_cached"
        "  cold_ms  follow/first  cold/follow  rewarm_race_ms  cold_same_est_ms",
    ]
    for c in conversations:
        first, cold = c.of("first")[0], c.of("cold")[0]
        follow, after = c.median("follow-up"), c.median("after-frames")
        race = c.of("re-warm")
        race_text = "             -                 -"
        if race:
            estimate = cold.ttft_ms / cold.prompt_tokens * race[0].prompt_tokens
            race_text = f"  {race[0].ttft_ms:14.1f}  {estimate:16.1f}"
        lines.append(
            f"{c.frames:6d}  {first.prompt_tokens:10d}  {first.ttft_ms:8.1f}  {first.cached_share:11.1%}"
            f"  {follow:9.1f}  {c.min_share('follow-up'):12.1%}  {after:13.1f}  {c.min_share('after-frames'):16.1%}"
            f"  {cold.ttft_ms:7.1f}  {follow / first.ttft_ms:11.2f}x  {cold.ttft_ms / follow:10.1f}x{race_text}"
        )
    return "\n".join(lines)


def run_conversation(model: str | None, counts: list[int], follow_ups: int = 3) -> str:
    """Start a server and run one conversation per frame count; returns the table."""
    settings = Settings(model=model, port=0, max_queue=max(counts) + 32, idle_timeout_s=600)
    with run_server(settings) as server:
        asyncio.run(converse(server, 2, 1))  # warm the model itself (first-call costs)

        async def all_counts() -> list[Conversation]:
            return [await converse(server, n, follow_ups) for n in counts]

        conversations = asyncio.run(all_counts())
    return render(conversations)
