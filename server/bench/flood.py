"""``livesight bench load --flood ping|query|cancel``: one session floods control messages
while the others stream.

The flooder opens its session with the others, sends one frame (so a flood of questions has
something to look at) and waits. From the middle of the run until just before its end it
sends one kind of message back to back, as fast as its event loop can, while it reads every
reply. It runs in a load generator process of its own, so the victims' clients do not share
its event loop.

Printed: the victims' ack latency (send -> ack) for the frames sent in the first half
(without the flood, after the first second) and in the second half (with it, until a second
before the end), the ratio of the two, and what the flooder sent and got back: replies by
type, ``error`` events by code (``rate_limited`` named even when there are none), and
whether the server closed it (close code and reason).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import websockets

from handlers.wire.protocol import ErrorEvent, Ping, ResponseCancel, VideoQuery
from server.bench.latency import percentile, spread
from server.client.connection import Connection, StreamError

MESSAGES = {
    "ping": Ping(type="ping"),
    "query": VideoQuery(type="video.query", text="what is happening?"),
    "cancel": ResponseCancel(type="response.cancel"),
}
#: After the flood, replies still in flight are read for this long before the flooder closes.
DRAIN_S = 1.5


@dataclass(frozen=True)
class FloodPlan:
    """When the flood runs, wall clock (``time.time``): the run starts at ``start_at`` and
    lasts ``seconds``; the flood takes its second half."""

    kind: str
    start_at: float
    seconds: float

    @property
    def baseline(self) -> tuple[float, float]:
        """The frames measured without the flood: sent after the first second, before it."""
        return self.start_at + 1.0, self.flood_from

    @property
    def flood_from(self) -> float:
        return self.start_at + self.seconds / 2

    @property
    def flooded(self) -> tuple[float, float]:
        """The frames measured with the flood: sent from its start until a second before the end."""
        return self.flood_from, self.start_at + self.seconds - 1.0

    @property
    def flood_until(self) -> float:
        return self.start_at + self.seconds - 0.5


@dataclass
class FloodTally:
    """What the flooder sent and got back."""

    sent: int = 0
    seconds: float = 0.0
    replies: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    refused: str | None = None  # the error code when the session was refused at the start
    closed_by_server: bool = False
    close_code: int | None = None
    close_reason: str = ""


async def _read_replies(conn: Connection, tally: FloodTally, closing: asyncio.Event) -> None:
    async for received in conn.events(skip_unknown=True):
        tally.replies[received.type] = tally.replies.get(received.type, 0) + 1
        if isinstance(received.event, ErrorEvent):
            tally.errors[received.event.code] = tally.errors.get(received.event.code, 0) + 1
    if not closing.is_set():
        tally.closed_by_server = True


async def _flood(conn: Connection, plan: FloodPlan, tally: FloodTally) -> None:
    raw = MESSAGES[plan.kind].model_dump_json(exclude_none=True)
    await asyncio.sleep(max(0.0, plan.flood_from - time.time()))
    started = time.perf_counter()
    try:
        # A send the server does not read (TCP pushes back) is cut short when the time is up.
        async with asyncio.timeout(max(0.0, plan.flood_until - time.time())):
            while True:
                await conn.send_raw(raw)
                tally.sent += 1
                await asyncio.sleep(0)  # the reader's turn: a flood that reads its replies
    except TimeoutError:
        pass
    except websockets.ConnectionClosed:
        tally.closed_by_server = True
    tally.seconds = time.perf_counter() - started


async def _flooder(url: str, plan: FloodPlan, frame: str, config: dict) -> FloodTally:
    tally = FloodTally()
    try:
        # No keepalive pings: a server too busy to answer them is what is measured, and the
        # client must not close the connection itself.
        conn, _ = await Connection.open(url, config, open_timeout=60, compression=None, ping_interval=None)
    except StreamError as refused:
        tally.refused = refused.code
        return tally
    closing = asyncio.Event()
    try:
        await conn.send_frame(frame, frame_id="flood-0")
        await conn.wait_acks(1)
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(_read_replies(conn, tally, closing))
            await _flood(conn, plan, tally)
            await asyncio.wait({reader}, timeout=DRAIN_S)
            closing.set()
            await conn.close()  # the reader ends with the connection
    finally:
        closing.set()
        await conn.close()
    # The server closed first when its close frame came before ours (websockets' protocol
    # state), or when the connection dropped with no close frame either way.
    protocol = conn.ws.protocol
    dropped = protocol.close_rcvd is None and protocol.close_sent is None
    tally.closed_by_server = tally.closed_by_server or protocol.close_rcvd_then_sent is True or dropped
    if tally.closed_by_server:
        tally.close_code, tally.close_reason = conn.ws.close_code, conn.ws.close_reason or ""
    return tally


def run_flooder(url: str, plan: FloodPlan, frame: str, config: dict) -> FloodTally:
    """The flooder's load generator process: waits for the run's start, floods; returns its tally."""
    time.sleep(max(0.0, plan.start_at - time.time()))
    return asyncio.run(_flooder(url, plan, frame, config))


def _between(sent_at: list[float], values: list[float], window: tuple[float, float]) -> list[float]:
    return [value for sent, value in zip(sent_at, values) if window[0] <= sent < window[1]]


def flood_report(plan: FloodPlan, flood: FloodTally, sessions: int, ack_sent_at: list[float], ack_ms: list[float],
                 shed_sent_at: list[float]) -> list[str]:
    """The report lines: the victims' acks without and with the flood, and the flooder's tally."""
    without, flooded = (_between(ack_sent_at, ack_ms, w) for w in (plan.baseline, plan.flooded))
    shed_without, shed_with = (len(_between(shed_sent_at, shed_sent_at, w)) for w in (plan.baseline, plan.flooded))

    def ratio(q: float) -> str:
        return f"{percentile(flooded, q) / percentile(without, q):.2f}x" if without and flooded else "nan"

    worst = max(flooded, default=float("nan")) / max(without, default=float("nan"))
    if flood.refused:
        closed = f"the flooder's session was refused ({flood.refused})"
    elif flood.closed_by_server:
        closed = f"the server closed the flooder (close code {flood.close_code}, reason {flood.close_reason!r})"
    else:
        closed = "the server did not close the flooder"
    errors = {"rate_limited": 0, **flood.errors}
    return [
        f"flood of {plan.kind} from the middle of the run: the flooder sent {flood.sent} in {flood.seconds:.1f} s "
        f"({flood.sent / max(flood.seconds, 1e-9):.0f}/s); replies {flood.replies or 'none'}; error codes {errors}; "
        f"{closed}",
        f"the {sessions} streaming sessions' acks without the flood: {spread(without)} ({len(without)} acks, "
        f"{shed_without} shed); with it: {spread(flooded)} ({len(flooded)} acks, {shed_with} shed); "
        f"with/without p50 {ratio(0.5)}, p99 {ratio(0.99)}, max {worst:.2f}x",
    ]
