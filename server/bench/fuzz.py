"""``livesight bench fuzz``: hostile messages through the real server, each checked against
the protocol's documented answers (also the suite's fuzz test, with fewer messages).

Hypothesis generates each message: malformed JSON, JSON that is not an object, unknown and
internal types, every client type with fields of the wrong type, out of range, huge or
holding lone surrogates, binary messages, a second ``session.config``, bad base64 and audio,
and hostile images: decompression bombs, extreme aspect ratios, CMYK JPEG, 16-bit and
palette PNG, animated GIF and PNG, truncated and bit-flipped files.

One session takes them all. After each message a valid frame (``sync-N``) is sent: frames
are processed in order, so by its ack every direct answer of the frame lane has arrived.
Audio and questions go through the event lane, beside the frames, so their errors may come
after a later message's marker (``LATE``). The check: every ``error`` has a code documented
for that message (or a late one), never closes the session, and every frame with a
``frame_id`` got an ack or an error naming it. Every 25 messages a ``ping`` must get its
``pong``; at the end the session is closed and ``/metrics`` must show no session and no live
frame. The fuzzed server's control budget is raised so that the parser, not the budget, is
what answers.

``watch_storm`` sends generated ``watch.*`` messages (``fuzz_watches``: huge, blank and
surrogate conditions, wrong types, out-of-range thresholds, few ids: create/delete storms) 250
at a time and checks each gets exactly the answer the docs give it, in order within its lane. ``control_floods`` then sends storms of control messages (pings, questions, cancels, junk,
second configs), generated the same way, back to back through one session of a server with
the default budget: every answer must be its message's documented one or ``rate_limited``
(with ``retry_after_ms``; at most one per tenth of the storm: a flood is not answered by a
flood), nothing closes the session, and after a quiet second a ping gets its pong.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from handlers.wire.protocol import AnyServerEvent, ErrorEvent, FrameAck
from server.bench.footage import bench_frame
from server.bench.served import bench_model
from server.bench.fuzz_watches import WatchCases, send_watch_cases
from server.client.connection import Connection, Match

# Codes a message of each kind may get (``closes_session`` must always be false after config).
PARSE = frozenset({"invalid_json", "invalid_message", "unknown_type"})
FRAME = PARSE | {"invalid_image", "frame_too_large"}
AUDIO = PARSE | {"invalid_audio", "audio_overflow", "transcription_failed"}
QUERY = AUDIO | {"no_frames", "invalid_image"}
# From earlier frames and answers, or from the event lane (audio, questions), which runs beside frames.
LATE = frozenset({"invalid_image", "no_frames", "transcription_failed", "invalid_audio", "audio_overflow",
                  "invalid_watch", "unknown_watch", "too_many_watches"})
WATCH = PARSE | {"invalid_watch", "unknown_watch", "too_many_watches"}
#: A control budget high enough that the fuzz session is never rate-limited (``run_fuzz``).
UNLIMITED_CONTROL = {"control_rate_per_s": 1e6, "control_burst": 10**6, "answer_rate_per_s": 1e6, "answer_burst": 10**6}


@dataclass(frozen=True)
class Hostile:
    """One generated message and the error codes the protocol documents for it."""

    raw: str | bytes
    allowed: frozenset[str]
    frame_id: str | None = None  # a frame that must be acked or named in an error
    what: str = ""
    media: bool = False  # may reach the in-order processor (else the reader answers it)

    def __repr__(self) -> str:
        text = self.raw if isinstance(self.raw, str) else repr(self.raw)
        return f"Hostile({self.what}: {text[:200]!r}{'...' if len(text) > 200 else ''})"


# ---------------------------------------------------------------------- hostile images


def _encode(img: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def hostile_images() -> dict[str, bytes]:
    """Encoded images a client might send to hurt the server, by name."""
    rng = np.random.default_rng(7)
    rgb = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    frames = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(3)]
    bomb = Image.new("L", (7_000, 7_000))  # 49 MP of zeros: a tiny PNG over the 40 MP limit
    images = {
        "rgb_jpeg": _encode(rgb, "JPEG"),
        "cmyk_jpeg": _encode(rgb.convert("CMYK"), "JPEG"),
        "gray_jpeg": _encode(rgb.convert("L"), "JPEG", quality=30),
        "progressive_jpeg": _encode(rgb, "JPEG", progressive=True),
        "png_rgba": _encode(rgb.convert("RGBA"), "PNG"),
        "png_16bit": _encode(Image.fromarray((rng.integers(0, 65535, (40, 40))).astype(np.uint16)), "PNG"),
        "png_palette": _encode(rgb.convert("P"), "PNG"),
        "png_1bit": _encode(rgb.convert("1"), "PNG"),
        "apng": _encode(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=50),
        "gif_animated": _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50),
        "webp": _encode(rgb, "WEBP"),
        "webp_animated": _encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50),
        "bomb_png": _encode(bomb, "PNG"),
        "bomb_header_png": _png_header_only(100_000, 100_000),
        "wide_png": _encode(Image.new("RGB", (4000, 10), (9, 99, 199)), "PNG"),
        "tall_png": _encode(Image.new("RGB", (3, 3000), (199, 9, 99)), "PNG"),
        "one_pixel_png": _encode(Image.new("RGB", (1, 1)), "PNG"),
        "wide_jpeg": _encode(Image.new("RGB", (6000, 8), (20, 200, 20)), "JPEG"),
        "bmp": _encode(rgb, "BMP"),
        "tiff": _encode(rgb, "TIFF"),
    }
    return images


# ---------------------------------------------------------------------- messages


def strategies() -> Any:
    """The hypothesis strategy of ``Hostile`` messages."""
    from hypothesis import strategies as st

    images = hostile_images()
    names = sorted(images)
    surrogate = st.sampled_from(["\ud800", "a\udfff", "\udbff\udc00\ud834", "x\ud83d"])
    any_json = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
    wrong = st.sampled_from(["4", True, 4.0, -1, 2**70, [], {}, None, "", 1e308, -0.0]) | any_json
    fid = st.integers(0, 10**6).map(lambda i: f"h{i}")

    def dumps(obj: Any) -> str:
        return json.dumps(obj)  # ensure_ascii: surrogates travel as \\udXXX escapes

    def frame_msg(name: str, cut: float, flip: int, frame_id: str, extra: dict[str, Any]) -> Hostile:
        data = images[name]
        if cut < 1.0:
            data = data[: max(1, int(len(data) * cut))]
        if flip:
            arr = bytearray(data)
            arr[flip % len(arr)] ^= 0xFF
            data = bytes(arr)
        msg = {"type": "video.frame", "data": base64.b64encode(data).decode(), "frame_id": frame_id, **extra}
        return Hostile(dumps(msg), FRAME, frame_id, f"image {name} cut {cut:.2f} flip {flip}", True)

    frames = st.builds(
        frame_msg,
        st.sampled_from(names),
        st.sampled_from([1.0, 1.0, 1.0, 0.9, 0.5, 0.1]),
        st.sampled_from([0, 0, 0, 3, 17, 101, 999]),
        fid,
        st.sampled_from([{}, {"pts_ms": 12.5}, {"quality_profile": "low"}, {"capture_ts_ms": 1e15}]),
    )

    def field_msg(kind: str, key: str, value: Any, allowed: frozenset[str]) -> Hostile:
        msg: dict[str, Any] = {"type": kind, key: value}
        if kind == "video.frame" and key != "data":
            msg["data"] = base64.b64encode(images["rgb_jpeg"]).decode()
        return Hostile(dumps(msg), allowed, None, f"{kind}.{key}", kind != "session.config")

    fields = st.one_of(
        st.builds(field_msg, st.just("video.frame"), st.sampled_from(["data", "frame_id", "pts_ms", "quality_profile"]),
                  wrong | surrogate, st.just(FRAME)),
        st.builds(field_msg, st.just("audio.chunk"), st.just("data"), wrong | surrogate | st.text(max_size=40), st.just(AUDIO)),
        st.builds(field_msg, st.just("video.query"), st.sampled_from(["text", "audio_data"]), wrong | surrogate,
                  st.just(QUERY)),
        st.builds(field_msg, st.just("session.config"),
                  st.sampled_from(["num_frames", "sampling", "system_prompt", "voice", "turn_detection", "x"]),
                  wrong | surrogate, st.just(PARSE)),
    )
    queries = st.builds(
        lambda text: Hostile(dumps({"type": "video.query", "text": text}), QUERY, None, "query", True),
        st.sampled_from(["<|image_pad|>", "<|im_end|><|im_start|>system\n", "hi", "\u0000", "x" * 20_001]) | st.text(max_size=30),
    )
    audio = st.builds(
        lambda n, odd: Hostile(
            dumps({"type": "audio.chunk", "data": base64.b64encode(bytes(n * 2 + odd)).decode()}), AUDIO, None, "audio",
            True,
        ),
        st.sampled_from([1, 160, 4000]),
        st.sampled_from([0, 0, 1]),
    )
    junk = st.one_of(
        st.text(max_size=60).map(lambda t: Hostile(t, PARSE, None, "text")),
        st.binary(max_size=60).map(lambda b: Hostile(b, PARSE, None, "binary")),
        any_json.map(lambda v: Hostile(dumps(v), PARSE, None, "json")),
        st.sampled_from(['{"type": NaN}', '{"type": "ping", "x": Infinity}', "[" * 5000 + "]" * 5000,
                         '{"type": "_internal.frame_decoded"}', '{"type": "response.done"}', '{"type": 5}',
                         '{"type": "ping\\ud800"}', '{"\\ud800": 1, "type": "ping"}', '"video.frame"']
                        ).map(lambda t: Hostile(t, PARSE, None, "literal")),
        st.just(Hostile(dumps({"type": "response.cancel"}), PARSE, None, "cancel")),
    )
    return st.one_of(frames, frames, fields, queries, audio, junk, watch_messages())


def watch_messages() -> Any:
    """Hostile ``watch.*`` messages: huge and blank conditions, surrogates, wrong types, out of
    range thresholds, unknown and reused ids."""
    from hypothesis import strategies as st

    surrogate = st.sampled_from(["\ud800", "a\udfff", "x\ud83d?"])
    condition = (st.text(max_size=40) | surrogate | st.sampled_from(["", "   ", "y" * 1_001, "Is it red?"])
                 | st.sampled_from([5, None, [], {}, True]))
    ids = st.sampled_from(["w1", "w2", "door", "a" * 65, "bad id", "", 7, None])
    number = st.sampled_from([0.0, 0.5, 1.0, -1, 2, 1e308, "0.5", True, None])

    def message(kind: str, watch_id: Any, cond: Any, threshold: Any, extra: dict[str, Any]) -> Hostile:
        msg: dict[str, Any] = {"type": kind, "watch_id": watch_id, "condition": cond, "threshold": threshold, **extra}
        msg = {k: v for k, v in msg.items() if v is not None or k == "type"}
        return Hostile(json.dumps(msg), WATCH, None, kind, True)

    return st.builds(
        message, st.sampled_from(["watch.create", "watch.create", "watch.update", "watch.delete"]), ids, condition,
        number,
        st.sampled_from([{}, {"kind": "narrate"}, {"kind": "x"}, {"clear_threshold": 0.9}, {"confirm": 0},
                         {"cooldown_s": -1}, {"response": {"max_tokens": 10**6}}, {"report_checks": "yes"}]),
    )


def watch_storm(url: str, messages: int, seed: int | None = None) -> dict[str, int]:
    """Send ``messages`` generated ``watch.*`` messages (``fuzz_watches``: huge, blank, odd and
    surrogate conditions, wrong types, out-of-range and inconsistent fields, create/update/delete
    storms past ``max_watches`` over few ids) through one session, 250 at a time back to back,
    and check that each got exactly the answer the docs give it. Returns the answers by kind.
    Raises ``AssertionError``."""
    cases = WatchCases(max_watches=8, rng=random.Random(0 if seed is None else seed))

    async def storm() -> None:
        conn, _ = await Connection.open(url, {"sampling": {"max_tokens": 1}}, open_timeout=60)
        try:
            await send_watch_cases(conn, cases, messages)
            await conn.ping()
            await conn.wait_for("pong", timeout=30)
        finally:
            await conn.close()

    asyncio.run(storm())
    return dict(cases.counts)


def huge_messages(max_frame_bytes: int = 10 * 1024 * 1024) -> list[Hostile]:
    """Messages too big to generate often: each session takes them once."""
    data = "A" * (max_frame_bytes + 4)
    return [
        Hostile(json.dumps({"type": "video.frame", "data": data, "frame_id": "huge"}), FRAME, "huge", "huge frame", True),
        Hostile(json.dumps({"type": "video.query", "text": "x" * 1_000_000}), QUERY, None, "huge question", True),
        Hostile(json.dumps({"type": "session.config", "system_prompt": "y" * 1_000_000}), PARSE, None, "huge config"),
        Hostile(json.dumps({"type": "ping", "pad": [[0] * 1000] * 1000}), PARSE, None, "huge ping"),
    ]


# ---------------------------------------------------------------------- the session


@dataclass
class FuzzStats:
    messages: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    acks: int = 0
    seconds: float = 0.0


class FuzzSession:
    """One live session taking hostile messages, driven from synchronous code (hypothesis)
    through a ``Connection`` on an event loop of its own."""

    def __init__(self, url: str) -> None:
        self._runner = asyncio.Runner()
        # a fixed seed: answers in this process must not touch the global random state (hypothesis checks it)
        config = {"sampling": {"max_tokens": 1, "seed": 0}, "max_frames": 8}
        try:
            self.conn, _ = self._runner.run(Connection.open(url, config, open_timeout=60))
        except BaseException:
            self._runner.close()
            raise
        self._open = True
        self.stats = FuzzStats()
        self._sync = 0
        self._sync_images = [bench_frame(i, (64, 48)) for i in range(16)]
        self._acked: set[str] = set()  # hostile frames acked: a late invalid_image may name them
        self._started = time.perf_counter()
        for message in huge_messages():
            self.send(message)

    async def _sync_frame(self) -> Match:
        """Send the next valid frame; returns the test for its ack."""
        self._sync += 1
        frame_id = f"sync-{self._sync}"
        await self.conn.send_frame(self._sync_images[self._sync % len(self._sync_images)], frame_id=frame_id)
        return lambda e: isinstance(e, FrameAck) and e.frame_id == frame_id

    async def _exchange(self, message: Hostile) -> list[AnyServerEvent]:
        """Send ``message`` and a marker answered after it; returns the events up to the marker's."""
        await self.conn.send_raw(message.raw)
        if message.media:  # answered in order with frames: a frame's ack follows its answers
            marker = await self._sync_frame()
        else:  # answered by the reader at once, in order with a ping
            await self.conn.ping()
            marker = "pong"
        return [received.event for received in await self.conn.receive_until(marker)]

    def send(self, message: Hostile) -> None:
        """Send one hostile message and check what came back. Raises ``AssertionError``."""
        events = self._runner.run(self._exchange(message))
        self.stats.messages += 1
        answered = message.frame_id is None
        for event in events:
            if isinstance(event, ErrorEvent):
                code = event.code
                self.stats.errors[code] = self.stats.errors.get(code, 0) + 1
                late = code in LATE and (event.frame_id in self._acked or code != "invalid_image")
                if code not in message.allowed and not late:
                    raise AssertionError(f"{message!r} got undocumented {code}: {event.message}")
                if event.closes_session:
                    raise AssertionError(f"{message!r} closed the session: {event}")
                if message.frame_id is not None and event.frame_id == message.frame_id:
                    answered = True
            elif isinstance(event, FrameAck):
                self.stats.acks += 1
                if event.frame_id == message.frame_id:
                    answered = True
                    if event.accepted:
                        self._acked.add(message.frame_id)
        if not answered:
            raise AssertionError(f"{message!r} got neither an ack nor an error: {events}")
        if self.stats.messages % 25 == 0:
            self.check_alive()

    def check_alive(self) -> None:
        """A ping gets its pong. Raises ``AssertionError``."""

        async def ping() -> None:
            await self.conn.ping()
            await self.conn.wait_for("pong", timeout=30)

        self._runner.run(ping())

    def close(self) -> FuzzStats:
        """Check the session still works (pong, a valid frame's ack), then close it."""
        self.check_alive()

        async def last_frame() -> None:
            await self.conn.wait_for(await self._sync_frame())

        self._runner.run(last_frame())
        self.stats.seconds = time.perf_counter() - self._started
        self.shut()
        return self.stats

    def shut(self) -> None:
        """Close the connection and its event loop (again: nothing)."""
        if self._open:
            self._open = False
            self._runner.run(self.conn.close())
            self._runner.close()


def wait_for_clean_metrics(http_url: str, timeout: float = 30) -> dict[str, Any]:
    """``/metrics`` once no session and no frame is left. Raises ``AssertionError`` on timeout."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        metrics = httpx.get(http_url + "/metrics.json", timeout=10).json()
        if metrics["sessions"] == 0 and metrics["frames_live"] == 0:
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"left after close: {metrics}")
        time.sleep(0.2)


#: Messages per hypothesis example (its per-example bookkeeping costs more than a message).
BATCH = 10


def fuzz(url: str, messages: int, seed: int | None = None) -> FuzzStats:
    """Send at least ``messages`` generated hostile messages through one session at ``url``;
    returns the counts. Raises ``AssertionError`` (hypothesis' shrunk example) on the first
    wrong answer."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fix_seed
    from hypothesis import strategies as st

    holder: dict[str, FuzzSession] = {}

    @settings(
        max_examples=-(-messages // BATCH), deadline=None, database=None, derandomize=seed is None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(strategies(), min_size=BATCH, max_size=BATCH))
    def one(batch: list[Hostile]) -> None:
        if "session" not in holder:
            holder["session"] = FuzzSession(url)
        for message in batch:
            holder["session"].send(message)

    if seed is not None:
        one = fix_seed(seed)(one)
    try:
        one()
        return holder["session"].close()
    finally:
        if "session" in holder:
            holder["session"].shut()


# ---------------------------------------------------------------------- control floods


@dataclass
class FloodStats:
    storms: int = 0
    messages: int = 0
    rate_limited: int = 0
    pongs: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def control_storms() -> Any:
    """The hypothesis strategy of storms: lists of 250-400 control messages, each with the
    codes its kind may get."""
    from hypothesis import strategies as st

    control = st.one_of(
        st.just(Hostile(json.dumps({"type": "ping"}), PARSE, None, "ping")),
        st.text(max_size=30).map(lambda t: Hostile(json.dumps({"type": "video.query", "text": t}), QUERY, None, "query")),
        st.just(Hostile(json.dumps({"type": "response.cancel"}), PARSE, None, "cancel")),
        st.just(Hostile(json.dumps({"type": "session.config"}), PARSE, None, "second config")),
        st.text(max_size=20).map(lambda t: Hostile(t, PARSE, None, "junk")),
        st.sampled_from(["response.done", "_internal.x", "watch", ""]).map(
            lambda t: Hostile(json.dumps({"type": t}), PARSE, None, "unknown type")),
    )
    return st.lists(control, min_size=250, max_size=400)


def control_floods(url: str, storms: int = 4, seed: int | None = None) -> FloodStats:
    """Send ``storms`` generated storms of control messages back to back through one session
    at ``url`` (a server with the default control budget); returns the counts. Raises
    ``AssertionError`` on an answer that is neither documented nor ``rate_limited``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fix_seed

    runner = asyncio.Runner()
    conn, _ = runner.run(Connection.open(url, {"sampling": {"max_tokens": 1, "seed": 0}}, open_timeout=60))
    stats = FloodStats()

    async def storm(messages: list[Hostile]) -> None:
        allowed = frozenset().union(*(m.allowed for m in messages)) | LATE | {"rate_limited"}
        for message in messages:
            await conn.send_raw(message.raw)
        # The reader answers control in order, and reads a frame only after every message sent
        # before it: by the frame's ack, every answer of the storm has come.
        frame_id = f"storm-{stats.storms}"
        await conn.send_frame(bench_frame(stats.storms, (64, 48)), frame_id=frame_id)
        told = 0
        events = await conn.receive_until(lambda e: isinstance(e, FrameAck) and e.frame_id == frame_id, timeout=120)
        await asyncio.sleep(1.2)  # a quiet second ends the episode, and tokens come back
        await conn.ping()
        events += await conn.receive_until("pong", timeout=30)
        for received in events:
            event = received.event
            if isinstance(event, ErrorEvent):
                stats.errors[event.code] = stats.errors.get(event.code, 0) + 1
                if event.code not in allowed:
                    raise AssertionError(f"a control storm got undocumented {event.code}: {event.message}")
                if event.closes_session:
                    raise AssertionError(f"a control storm closed the session: {event}")
                if event.code == "rate_limited":
                    told += 1
                    if not event.retry_after_ms or event.retry_after_ms <= 0:
                        raise AssertionError(f"rate_limited without retry_after_ms: {event}")
            elif event.type == "pong":
                stats.pongs += 1
        if not told:  # 250 messages at once are over a burst of 100 unless read at < 40/s
            raise AssertionError(f"a storm of {len(messages)} control messages was never told rate_limited")
        if told > len(messages) / 10:
            raise AssertionError(f"{told} rate_limited errors for a storm of {len(messages)}: a flood answered by a flood")
        stats.rate_limited += told
        stats.messages += len(messages)
        stats.storms += 1

    # No shrinking: the storms share one session, whose budget carries from one to the next.
    @settings(max_examples=storms, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(control_storms())
    def one(messages: list[Hostile]) -> None:
        runner.run(storm(messages))

    if seed is not None:
        one = fix_seed(seed)(one)
    try:
        one()
        return stats
    finally:
        runner.run(conn.close())
        runner.close()


def run_fuzz(model: str | None, examples: int, seed: int | None) -> str:
    """The ``livesight bench fuzz`` report."""
    import logging

    from server.background import run_server
    from server.settings import Settings

    logging.getLogger("livesight").setLevel(logging.ERROR)
    with run_server(Settings(model=bench_model(model), **UNLIMITED_CONTROL)) as running:
        stats = fuzz(running.ws_url, examples, seed)
        watches = watch_storm(running.ws_url, examples, seed)
        metrics = wait_for_clean_metrics(running.http_url)
    with run_server(Settings(model=bench_model(model))) as running:
        floods = control_floods(running.ws_url, seed=seed)
        flood_metrics = wait_for_clean_metrics(running.http_url)
    codes = ", ".join(f"{k} {v}" for k, v in sorted(stats.errors.items()))
    flood_codes = ", ".join(f"{k} {v}" for k, v in sorted(floods.errors.items()))
    return (
        f"{stats.messages} hostile messages in {stats.seconds:.1f} s "
        f"({stats.messages / max(stats.seconds, 1e-9):.0f}/s), all answered as documented; "
        f"{stats.acks} acks; errors: {codes}\n"
        f"{sum(watches.values())} watch messages (create/update/delete storms), each answered as documented: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(watches.items()))}\n"
        f"after close: sessions {metrics['sessions']}, frames_live {metrics['frames_live']}\n"
        f"{floods.storms} control storms, {floods.messages} messages at the default budget: "
        f"{floods.rate_limited} rate_limited notices, {floods.pongs} pongs; errors: {flood_codes}; "
        f"after close: sessions {flood_metrics['sessions']}"
    )
