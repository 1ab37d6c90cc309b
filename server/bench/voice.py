"""``livesight bench voice``: speech out and voice in, measured through the real server.

- Sentence to first audio: a client splits the streamed text into sentences exactly as the
  server does; for every answer it times the delta that completes the first sentence to the
  first audio delta (target: 50 ms).
- Real-time factor of the speech stage: eSpeak NG synthesis plus resampling, seconds of work
  per second of speech, timed in process on a fixed paragraph.
- Turn detection: questions spoken by eSpeak (with a faint noise floor) are streamed as
  microphone audio in real time; the detected start and stop are compared with where the
  speech really is, and the transcript with the words.
- Barge-in: a question spoken over a running answer; the cut-off is the time from the audio
  chunk that let the detector fire to the interrupted ``response.done``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from handlers.session.voice import SentenceSplitter
from handlers.wire.protocol import (
    InputAudioSpeechStarted,
    InputAudioSpeechStopped,
    InputAudioTranscript,
    ResponseAudioDelta,
    ResponseDone,
    ResponseTextDelta,
    SessionReady,
)
from server.bench.footage import bench_frame
from server.bench.served import bench_model
from server.bench.spoken import espeak, speak_clip
from server.client.connection import Connection, Match, Received, matcher
from server.speech.wav import INPUT_RATE, OUTPUT_RATE

QUESTIONS = ["what is on the table", "how many people are in the room", "is the door open"]
PARAGRAPH = (
    "The camera shows a kitchen table with two cups on it. A woman walks in from the left and "
    "picks up the red cup. She looks at the window, then sits down. Outside, a car passes slowly. "
    "Nothing else moves in the room. The light is warm, as in the late afternoon. On the wall "
    "there is a clock that says ten past five. The second cup is still on the table, half full."
)


# ---------------------------------------------------------------------- a recording client


@dataclass
class VoiceClient:
    """A ``Connection`` whose every event is recorded as it arrives (a reader runs beside the
    caller), with every audio chunk's send time: latencies are measured from both."""

    conn: Connection
    events: list[Received] = field(default_factory=list)
    sent_chunks: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, end sample)
    samples_sent: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str, **config: Any) -> AsyncIterator[tuple[VoiceClient, SessionReady]]:
        """A session with ``config``; yields the client and its ``session.ready``, closes on exit.
        Raises ``StreamError`` when the server refuses the session."""
        conn, ready = await Connection.open(url, config)
        client = cls(conn)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(client._read())
                try:
                    yield client, ready.event
                finally:
                    await conn.close()  # the reader ends with the connection
        finally:
            await conn.close()

    async def _read(self) -> None:
        async for received in self.conn.events():
            self.events.append(received)
            self._arrived.set()

    async def frame(self, seed: int = 0) -> None:
        await self.conn.send_frame(bench_frame(seed), frame_id=f"f{seed}")
        await self.wait_for("video.frame.ack")

    async def stream_audio(self, pcm16: bytes, chunk_ms: float = 20, realtime: bool = True) -> None:
        """Send ``pcm16`` as ``audio.chunk`` messages, paced like a microphone when ``realtime``."""
        step = int(INPUT_RATE * chunk_ms / 1000) * 2
        start = time.perf_counter()
        for i, at in enumerate(range(0, len(pcm16), step)):
            if realtime:
                delay = start + i * chunk_ms / 1000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            chunk = pcm16[at : at + step]
            await self.conn.send_audio(chunk)
            self.samples_sent += len(chunk) // 2
            self.sent_chunks.append((time.perf_counter(), self.samples_sent))

    def sent_at(self, sample: int) -> float:
        """When the chunk holding stream sample ``sample`` was sent."""
        for at, end in self.sent_chunks:
            if end >= sample:
                return at
        raise ValueError(f"sample {sample} was not sent")

    async def wait_for(self, match: Match, timeout: float = 60, after: int = 0) -> Received:
        """The first event (from index ``after``) that ``match`` matches (an event type, or a
        test on the typed event). Raises ``TimeoutError``."""
        is_match = matcher(match)
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            for item in self.events[seen:]:
                if is_match(item.event):
                    return item
            seen = len(self.events)
            self._arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching event within {timeout} s")
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                pass

    def of(self, kind: str, request_id: str | None = None) -> list[Received]:
        return [
            r for r in self.events
            if r.type == kind and (request_id is None or getattr(r.event, "request_id", None) == request_id)
        ]


def first_sentence_latency_ms(client: VoiceClient, request_id: str, max_chars: int) -> float | None:
    """Time from the text delta that completed the answer's first sentence (as the server's
    splitter with ``speech_max_sentence_chars`` = ``max_chars`` cuts it) to its first audio."""
    splitter = SentenceSplitter(max_chars)
    done_at = None
    for r in client.events:
        e = r.event
        if getattr(e, "request_id", None) != request_id:
            continue
        if isinstance(e, ResponseTextDelta) and done_at is None and splitter.feed(e.delta):
            done_at = r.at
        if isinstance(e, ResponseAudioDelta):
            return None if done_at is None else (r.at - done_at) * 1000
    return None


# ---------------------------------------------------------------------- measurements


def speech_rtf(repeats: int = 3) -> tuple[float, float]:
    """(real-time factor, median ms per sentence) of eSpeak synthesis plus resampling."""
    synth = espeak()
    sentences = SentenceSplitter(240).feed(PARAGRAPH + " ") + SentenceSplitter(240).flush()
    work, audio, per = 0.0, 0.0, []
    for _ in range(repeats):
        for sentence in sentences:
            started = time.perf_counter()
            pcm = synth.speak_sync(sentence, synth.default_voice, 1.0)
            took = time.perf_counter() - started
            work += took
            per.append(took * 1000)
            audio += len(pcm) / 2 / OUTPUT_RATE
    return work / audio, statistics.median(per)


async def stage_latencies(word_s: float = 0.03) -> list[float]:
    """The speech stage alone (no engine, no socket): ``PARAGRAPH`` streamed word by word every
    ``word_s``; ms from each sentence being complete to its audio being handed over."""
    import anyio

    from handlers.session.voice import SpokenAnswer
    from server.speech.espeak import EspeakSynthesizer

    synth = EspeakSynthesizer()
    await synth.start()

    async def deliver(wav: bytes, sentence: str) -> None:
        pass

    async def report(error: object) -> None:
        raise RuntimeError(f"speech failed: {error}")

    spoken = SpokenAnswer(
        synth, synth.default_voice, 1.0, max_sentence_chars=160, max_pending_sentences=16, pause_ms=120,
        deliver=deliver, report=report,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(spoken.run)
        for word in PARAGRAPH.split():
            await spoken.add_text(word + " ")
            await anyio.sleep(word_s)
        await spoken.finish()
    return [latency * 1000 for latency, _ in spoken.latencies]


async def sentence_latencies(url: str, answers: int, max_tokens: int, max_chars: int) -> list[float]:
    """First-sentence-to-first-audio times over ``answers`` spoken answers (``max_chars``: the
    server's ``speech_max_sentence_chars``)."""
    out = []
    config = {"modalities": ["text", "audio"], "sampling": {"max_tokens": max_tokens, "temperature": 0}}
    async with VoiceClient.open(url, **config) as (client, _):
        await client.frame(1)
        for i in range(answers):
            mark = len(client.events)
            await client.conn.query(f"Describe the scene. ({i})")
            done = await client.wait_for("response.done", timeout=300, after=mark)
            assert isinstance(done.event, ResponseDone)
            latency = first_sentence_latency_ms(client, done.event.request_id, max_chars)
            if latency is not None:
                out.append(latency)
    return out


@dataclass
class TurnResult:
    question: str
    start_error_ms: float
    end_error_ms: float
    transcript: str
    word_recall: float
    transcript_after_stop_ms: float


async def spoken_turns(url: str, questions: list[str], *, realtime: bool = True) -> list[TurnResult]:
    """Speak each question into a session with server turn detection; compare with the truth."""
    results = []
    config = {"modalities": ["text", "audio"], "turn_detection": {"type": "server_vad"},
              "sampling": {"max_tokens": 8, "temperature": 0}}
    async with VoiceClient.open(url, **config) as (client, _):
        await client.frame(1)
        for i, question in enumerate(questions):
            clip = speak_clip(question, noise=30, seed=i)
            offset_ms = client.samples_sent * 1000 / INPUT_RATE
            mark = len(client.events)
            await client.stream_audio(clip.pcm16, realtime=realtime)
            stopped = await client.wait_for("input_audio.speech_stopped", after=mark)
            transcript = await client.wait_for("input_audio.transcript", after=mark)
            await client.wait_for("response.done", timeout=120, after=mark)
            assert isinstance(stopped.event, InputAudioSpeechStopped)
            assert isinstance(transcript.event, InputAudioTranscript)
            words = question.split()
            heard = transcript.event.transcript.lower().split()
            results.append(
                TurnResult(
                    question,
                    stopped.event.audio_start_ms - offset_ms - clip.speech_start_ms,
                    stopped.event.audio_end_ms - offset_ms - clip.speech_end_ms,
                    transcript.event.transcript,
                    sum(w in heard for w in words) / len(words),
                    (transcript.at - stopped.at) * 1000,
                )
            )
    return results


@dataclass
class BargeIn:
    cutoff_ms: float  # from the chunk that let the detector fire to the interrupted response.done
    from_onset_ms: float  # from the chunk holding the true speech onset to the same response.done
    audio_after_done: int  # audio deltas of the old answer after its response.done (must be 0)
    detected_error_ms: float


async def barge_in(url: str, max_tokens: int = 1024) -> BargeIn:
    """Speak over a running spoken answer; measure how fast the answer stops."""
    config = {"modalities": ["text", "audio"], "turn_detection": {"type": "server_vad"},
              "sampling": {"max_tokens": max_tokens, "temperature": 0}}
    async with VoiceClient.open(url, **config) as (client, _):
        await client.frame(2)
        await client.conn.query("Describe everything you see.")
        first = await client.wait_for("response.output_audio.delta", timeout=120)
        assert isinstance(first.event, ResponseAudioDelta)
        old = first.event.request_id
        clip = speak_clip("wait a moment", lead_ms=300, noise=30, seed=7)
        offset = client.samples_sent
        mark = len(client.events)
        await client.stream_audio(clip.pcm16, realtime=True)
        started = await client.wait_for("input_audio.speech_started", after=mark)
        done = await client.wait_for(lambda e: isinstance(e, ResponseDone) and e.request_id == old)
        # The words spoken over the answer are the next question: it is heard, then dropped here.
        await client.wait_for("input_audio.transcript", timeout=120, after=mark)
        await client.conn.cancel()
        await client.wait_for(lambda e: isinstance(e, ResponseDone) and e.request_id != old, timeout=120)
        assert isinstance(started.event, InputAudioSpeechStarted)
        start_sample = round(started.event.audio_start_ms * INPUT_RATE / 1000)
        onset_sample = offset + round(clip.speech_start_ms * INPUT_RATE / 1000)
        fired = client.sent_at(start_sample + 512)  # the first speech window is complete
        onset = client.sent_at(onset_sample)
        after = [r for r in client.of("response.output_audio.delta", old) if r.at > done.at]
        return BargeIn(
            (done.at - fired) * 1000,
            (done.at - onset) * 1000,
            len(after),
            (start_sample - onset_sample) * 1000 / INPUT_RATE,
        )


def run_voice(model: str | None, answers: int, max_tokens: int) -> str:
    """Start a server on ``model`` (default: the tiny random-weight model), measure; returns the report."""
    from server.background import run_server
    from server.settings import Settings

    rtf, per_sentence = speech_rtf()
    stage = asyncio.run(stage_latencies())
    settings = Settings(model=bench_model(model), port=0)
    with run_server(settings) as server:
        url, chars = server.ws_url, settings.speech_max_sentence_chars
        asyncio.run(sentence_latencies(url, 1, 16, chars))  # first-call costs
        latencies = asyncio.run(sentence_latencies(url, answers, max_tokens, chars))
        turns = asyncio.run(spoken_turns(url, QUESTIONS))
        cut = asyncio.run(barge_in(url))
    lines = ["speech out (eSpeak NG, 22,050 -> 24,000 Hz)"]
    lines.append(
        f"  speech stage alone, English streamed at 33 words/s: sentence -> audio median "
        f"{statistics.median(stage):.1f} ms, max {max(stage):.1f} ms over {len(stage)} sentences (target 50 ms)"
    )
    if latencies:
        lines.append(
            f"  through the server ({model or 'tiny random-weight model'}), first sentence -> first audio delta at the "
            f"client: median {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms over "
            f"{len(latencies)} answers (target 50 ms)"
        )
    else:
        lines.append("  through the server: no answer completed a sentence")
    lines.append(f"  speech stage real-time factor: {rtf:.4f} ({1 / rtf:.0f}x faster than real time), "
                 f"median {per_sentence:.1f} ms per sentence")
    lines.append("voice in (Silero VAD, PocketSphinx), questions streamed in real time")
    for t in turns:
        lines.append(
            f"  {t.question!r}: start {t.start_error_ms:+.0f} ms, stop {t.end_error_ms:+.0f} ms, "
            f"heard {t.transcript!r} ({t.word_recall:.0%} of the words), transcript {t.transcript_after_stop_ms:.0f} ms "
            "after speech_stopped"
        )
    lines.append(
        f"barge-in: answer stopped {cut.cutoff_ms:.1f} ms after the audio that let the detector fire "
        f"({cut.from_onset_ms:.1f} ms after the true onset was sent; onset detected {cut.detected_error_ms:+.0f} ms "
        f"from the truth); audio deltas after response.done: {cut.audio_after_done}"
    )
    return "\n".join(lines)
