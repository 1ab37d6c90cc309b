"""Prometheus metrics: one registry per app, fed by each session through its observer.

``GET /metrics`` serves ``Metrics.render()`` in the text exposition format. The session core
reports through ``handlers.session.observer.SessionObserver``; ``SessionMetrics`` is the
implementation that turns those calls into counters, gauges and histograms. Every metric is
documented in docs/metrics.md.
"""

from __future__ import annotations

import base64
import binascii
import struct
import time
from collections.abc import Callable

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from handlers.core.events import AnswerAudioDelta, AnswerEnded, ErrorReported, Event, FrameAcked, WatchFired
from handlers.wire.errors import ErrorCode
from handlers.session.observer import FrameOutcome, SessionObserver
from handlers.wire.protocol import AudioChunkIn, ClientEvent, VideoQuery

CONTENT_TYPE = CONTENT_TYPE_LATEST
PROTOCOLS = ("video_chat", "realtime", "gemini_live", "webrtc")
FRAME_OUTCOMES: tuple[FrameOutcome, ...] = ("accepted", "filtered", "evicted", "shed", "invalid")
ANSWER_STATUSES = ("completed", "interrupted", "failed")
#: Error codes that mean a frame was refused (counted as frames with outcome ``invalid`` too).
FRAME_ERRORS = frozenset({ErrorCode.INVALID_IMAGE.value, ErrorCode.FRAME_TOO_LARGE.value})
MIC_BYTES_PER_S = 16_000 * 2  # PCM16 mono at 16 kHz (protocol v1)

ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: How often the event loop's lag is sampled (``Metrics.watch_event_loop``).
LOOP_WATCH_PERIOD_S = 0.02
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The app's metric families in their own registry (several apps in one process never collide)."""

    def __init__(
        self, kv_cache_tokens: Callable[[], int | None] = lambda: None, parked: Callable[[], int] = lambda: 0
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("livesight_sessions", "Open sessions, by wire protocol", ["protocol"], registry=r)
        self.frames = Counter("livesight_frames", "Incoming video frames, by what became of them", ["outcome"], registry=r)
        self.ack_latency = Histogram(
            "livesight_ack_latency_seconds", "From a frame's receipt to its video.frame.ack being sent",
            buckets=ACK_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "livesight_ttft_seconds", "From a question to the answer's first output (response.done timings.ttft_ms)",
            buckets=TTFT_BUCKETS, registry=r,
        )
        self.loop_lag = Histogram(
            "livesight_event_loop_lag_seconds",
            f"How late the event loop ran a timer due every {LOOP_WATCH_PERIOD_S * 1000:g} ms",
            buckets=ACK_BUCKETS, registry=r,
        )
        #: The worst event-loop lag since /metrics.json was last read, in seconds.
        self.loop_lag_max_s = 0.0
        self.answers = Counter("livesight_answers", "Answers ended, by response.done status", ["status"], registry=r)
        self.errors = Counter("livesight_errors", "error events sent to clients, by code", ["code"], registry=r)
        self.control_refused = Counter(
            "livesight_control_refused", "Control messages refused: their session was over its control budget",
            registry=r,
        )
        self.watch_checks = Counter("livesight_watch_checks", "Watch checks run on a warm prefix", registry=r)
        self.watch_skipped = Counter(
            "livesight_watch_checks_skipped",
            "Accepted frames of sessions with watches that no check looked at (the model was busy, or too soon)",
            registry=r,
        )
        self.watch_fires = Counter("livesight_watch_fires", "Watches fired (watch.fired sent)", registry=r)
        #: The same three counts, for /metrics.json.
        self.watch_totals = {"checks": 0, "skipped": 0, "fires": 0}
        self.memory_totals: dict[str, float] = {
            "captions": 0, "captions_skipped": 0,
            "caption_tokens_computed": 0, "caption_tokens_generated": 0, "caption_seconds": 0.0,
        }
        self.prompt_tokens = Counter("livesight_prompt_tokens", "Prompt tokens of answers (usage)", registry=r)
        self.cached_tokens = Counter(
            "livesight_cached_tokens", "Prompt tokens served from the engine's cache (usage)", registry=r
        )
        self.completion_tokens = Counter("livesight_completion_tokens", "Generated tokens (usage)", registry=r)
        self.audio_in = Counter(
            "livesight_audio_input_seconds", "Microphone audio received (audio.chunk and video.query)", registry=r
        )
        self.audio_out = Counter("livesight_audio_output_seconds", "Speech sent in answers", registry=r)
        kv = Gauge("livesight_kv_cache_tokens", "Tokens held in the embedded engine's KV caches", registry=r)
        kv.set_function(lambda: float(kv_cache_tokens() or 0))
        waiting = Gauge("livesight_sessions_parked", "Dropped sessions waiting to be resumed", registry=r)
        waiting.set_function(lambda: float(parked()))
        for protocol in PROTOCOLS:
            self.sessions.labels(protocol)
        for outcome in FRAME_OUTCOMES:
            self.frames.labels(outcome)
        for status in ANSWER_STATUSES:
            self.answers.labels(status)
        for code in ErrorCode:
            self.errors.labels(code.value)

    async def watch_event_loop(self) -> None:
        """Forever: time a short sleep; whatever it overran is time the event loop could not
        read a socket or send an ack (a blocking call, or the GIL held elsewhere)."""
        while True:
            started = time.perf_counter()
            await anyio.sleep(LOOP_WATCH_PERIOD_S)
            lag = max(0.0, time.perf_counter() - started - LOOP_WATCH_PERIOD_S)
            self.loop_lag.observe(lag)
            self.loop_lag_max_s = max(self.loop_lag_max_s, lag)

    def take_loop_lag_max(self) -> float:
        """The worst event-loop lag since the previous call, in seconds."""
        worst, self.loop_lag_max_s = self.loop_lag_max_s, 0.0
        return worst

    def session_observer(self, protocol: str) -> SessionMetrics:
        """An observer for one new session speaking ``protocol``."""
        return SessionMetrics(self, protocol)

    def refused(self, code: ErrorCode) -> None:
        """A connection was refused before it became a session."""
        self.errors.labels(code.value).inc()

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)


class SessionMetrics(SessionObserver):
    """One session's observer: counts into its app's ``Metrics``."""

    def __init__(self, metrics: Metrics, protocol: str) -> None:
        self.m = metrics
        self.protocol = protocol
        self._open = False

    def opened(self) -> None:
        if not self._open:
            self._open = True
            self.m.sessions.labels(self.protocol).inc()

    def closed(self) -> None:
        if self._open:
            self._open = False
            self.m.sessions.labels(self.protocol).dec()

    def received(self, event: ClientEvent) -> None:
        if isinstance(event, AudioChunkIn):
            self.m.audio_in.inc(_base64_size(event.data) / MIC_BYTES_PER_S)
        elif isinstance(event, VideoQuery) and event.audio_data:
            self.m.audio_in.inc(_base64_size(event.audio_data) / MIC_BYTES_PER_S)

    def sent(self, event: Event) -> None:
        if isinstance(event, FrameAcked):
            self.m.ack_latency.observe(max(0.0, time.time() - event.server_receive_ts_ms / 1000.0))
        elif isinstance(event, AnswerEnded):
            self.m.answers.labels(event.status).inc()
            if event.timings.ttft_ms is not None:
                self.m.ttft.observe(event.timings.ttft_ms / 1000.0)
            self.m.prompt_tokens.inc(event.usage.prompt_tokens)
            self.m.cached_tokens.inc(event.usage.cached_tokens)
            self.m.completion_tokens.inc(event.usage.completion_tokens)
        elif isinstance(event, AnswerAudioDelta):
            self.m.audio_out.inc(wav_seconds(event.data))
        elif isinstance(event, WatchFired):
            self.m.watch_fires.inc()
            self.m.watch_totals["fires"] += 1
        elif isinstance(event, ErrorReported):
            self.m.errors.labels(event.code).inc()
            if event.code in FRAME_ERRORS:
                self.m.frames.labels("invalid").inc()

    def frames(self, outcome: FrameOutcome, count: int = 1) -> None:
        if count:
            self.m.frames.labels(outcome).inc(count)

    def refused(self) -> None:
        self.m.control_refused.inc()

    def checks(self, ran: int, skipped: int) -> None:
        self.m.watch_checks.inc(ran)
        self.m.watch_skipped.inc(skipped)
        self.m.watch_totals["checks"] += ran
        self.m.watch_totals["skipped"] += skipped

    def captions(self, written: int, skipped: int) -> None:
        self.m.memory_totals["captions"] += written
        self.m.memory_totals["captions_skipped"] += skipped

    def caption_work(self, computed: int, generated: int, seconds: float) -> None:
        totals = self.m.memory_totals
        totals["caption_tokens_computed"] += computed
        totals["caption_tokens_generated"] += generated
        totals["caption_seconds"] += seconds


def _base64_size(data: str) -> int:
    """Bytes that a base64 text (data-URL prefix allowed) decodes to, without decoding it."""
    if data.startswith("data:"):
        data = data.partition(",")[2]
    data = data.strip()
    return max(0, len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))))


def wav_seconds(data: str) -> float:
    """Duration of a base64 WAV (PCM) from its header and size; 0 when it is not a plain WAV."""
    try:
        head = base64.b64decode(data[:64])
    except (binascii.Error, ValueError):
        return 0.0
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE" or head[12:16] != b"fmt ":
        return 0.0
    channels, rate = struct.unpack_from("<HI", head, 22)
    bits = struct.unpack_from("<H", head, 34)[0]
    frame_bytes = channels * max(bits // 8, 1)
    if not rate or not frame_bytes:
        return 0.0
    return max(0, _base64_size(data) - 44) / (rate * frame_bytes)
