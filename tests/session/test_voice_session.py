"""The voice paths of a session with scripted stages: speech while generating, interrupts,
speech failures, native audio, transcription and server turn detection with barge-in."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import numpy as np
import pytest

from handlers.core.negotiation import Limits
from handlers.session.adapter import Session
from server.engines.base import AudioChunk, AudioSegment, Capabilities, EngineEvent, Finished, Prompt, Sampling, TextDelta, Usage
from server.speech.base import SpeechError, Synthesizer, Transcriber, VadStream, Voice, VoiceActivityModel
from server.speech.wav import encode_wav, parse_wav
from tests.protocol_client import b64, jpeg_frame
from tests.scripted import MemoryTransport, ScriptedEngine

pytestmark = pytest.mark.anyio

LIMITS = Limits(
    max_frame_bytes=1 << 20, max_audio_bytes=1 << 20, max_queue=200, idle_timeout_s=30,
    max_history_turns=4, max_answer_tokens=100,
)


@dataclass
class FakeSynthesizer(Synthesizer):
    """10 ms of a constant tone per character; records what it spoke."""

    delay_s: float = 0.0
    fail: bool = False
    spoken: list[str] = field(default_factory=list)
    name: str = "fake"
    default_voice: str = "v1"

    async def synthesize(self, text: str, voice: str, rate: float) -> bytes:
        await anyio.sleep(self.delay_s)
        if self.fail:
            raise SpeechError("down")
        self.spoken.append(text)
        return np.full(240 * len(text), 1000, "<i2").tobytes()


class FakeTranscriber(Transcriber):
    name = "fake-asr"

    async def transcribe(self, pcm16: bytes) -> str:
        return "what colour is the cup"


class LoudnessStream(VadStream):
    """Probability 0.9 for a window whose mean amplitude is over 1000, else 0."""

    def __init__(self) -> None:
        self.pending = b""

    def process(self, pcm16: bytes) -> list[float]:
        self.pending += pcm16
        out = []
        while len(self.pending) >= 1024:
            window, self.pending = self.pending[:1024], self.pending[1024:]
            out.append(0.9 if np.abs(np.frombuffer(window, "<i2")).mean() > 1000 else 0.0)
        return out


class LoudnessVad(VoiceActivityModel):
    name = "loudness"
    window_samples = 512

    def open_stream(self) -> VadStream:
        return LoudnessStream()

    async def probabilities(self, stream: VadStream, pcm16: bytes) -> list[float]:
        return stream.process(pcm16)


@dataclass
class OmniEngine(ScriptedEngine):
    """Speaks by itself: a 30 ms WAV chunk after every word."""

    def __post_init__(self) -> None:
        self.capabilities = Capabilities(name="omni", model="omni", audio_output=True)

    async def generate(
        self, session_id: str, request_id: str, prompt: Prompt, sampling: Sampling
    ) -> AsyncIterator[EngineEvent]:
        for word in self.words:
            yield TextDelta(word)
            yield AudioChunk(encode_wav(np.arange(720, dtype="<i2").tobytes()))
        yield Finished("stop", Usage(1, 0, len(self.words)))


LOUD = np.full(512, 4000, "<i2").tobytes()
QUIET = bytes(1024)


async def _run(engine, voice: Voice, body, **config) -> Session:
    transport = MemoryTransport()
    session = Session(transport, engine, LIMITS, config_timeout_s=5, voice=voice)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.run)
        await transport.put(type="session.config", **config)
        ready = await transport.get()
        assert ready["type"] == "session.ready"
        await transport.put(type="video.frame", data=b64(jpeg_frame(3)), frame_id=1)
        await transport.get_type("video.frame.ack")
        await body(transport, ready)
        transport.hang_up()
    return session


def _kinds(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


async def test_answer_is_spoken_sentence_by_sentence_while_generating() -> None:
    """Each sentence is spoken as soon as it is complete, before the answer ends; every delta
    is a 24 kHz WAV; audio.done comes before response.done."""
    engine = ScriptedEngine(words=["Hello there. ", "How are ", "you? ", "Fine"], step_s=0.05)
    synth = FakeSynthesizer()

    async def body(t: MemoryTransport, ready: dict) -> None:
        assert ready["capabilities"]["voice_output"] == "fake" and ready["config"]["voice"] == "v1"
        await t.put(type="video.query", text="hi")
        events = await t.until("response.done")
        kinds = _kinds(events)
        first_audio = kinds.index("response.output_audio.delta")
        assert first_audio < max(i for i, k in enumerate(kinds) if k == "response.text.delta")
        audio = [parse_wav(base64.b64decode(e["data"])) for e in events if e["type"] == "response.output_audio.delta"]
        assert len(audio) == 3 and {a.rate for a in audio} == {24_000}
        assert kinds[-3:] == ["response.text.done", "response.output_audio.done", "response.done"]
        assert events[-1]["status"] == "completed" and events[-1]["timings"]["first_audio_ms"] > 0

    await _run(engine, Voice(synthesizer=synth, sentence_pause_ms=0), body, modalities=["text", "audio"])
    assert synth.spoken == ["Hello there.", "How are you?", "Fine"]


async def test_interrupt_cuts_speech_at_once() -> None:
    """A cancel during speech ends the answer; none of its audio follows its response.done."""
    engine = ScriptedEngine(words=["One. ", "Two. ", "Three. "] * 5, step_s=0.01)
    synth = FakeSynthesizer(delay_s=0.2)

    async def body(t: MemoryTransport, ready: dict) -> None:
        await t.put(type="video.query", text="count")
        await t.get_type("response.text.delta")
        await anyio.sleep(0.1)
        await t.put(type="response.cancel")
        events = await t.until("response.done")
        assert events[-1]["status"] == "interrupted"
        await t.put(type="ping")
        after = await t.until("pong")
        assert "response.output_audio.delta" not in _kinds(after)

    await _run(engine, Voice(synthesizer=synth), body, modalities=["text", "audio"])
    assert len(synth.spoken) <= 1


async def test_speech_failure_is_reported_once_and_text_goes_on() -> None:
    """A synthesizer failure gives one speech_failed error; the text answer completes."""
    engine = ScriptedEngine(words=["A. ", "B. ", "C."])

    async def body(t: MemoryTransport, ready: dict) -> None:
        await t.put(type="video.query", text="x")
        events = await t.until("response.done")
        errors = [e for e in events if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["speech_failed"]
        assert events[-1]["status"] == "completed"
        assert next(e for e in events if e["type"] == "response.text.done")["text"] == "A. B. C."

    await _run(engine, Voice(synthesizer=FakeSynthesizer(fail=True)), body, modalities=["text", "audio"])


async def test_native_audio_passes_through_with_one_leading_trim() -> None:
    """An engine's own audio is not re-synthesized: the first chunk loses its first 10 ms,
    the others arrive byte for byte."""
    engine = OmniEngine(words=["Hi. ", "there."])
    synth = FakeSynthesizer()

    async def body(t: MemoryTransport, ready: dict) -> None:
        assert ready["capabilities"]["voice_output"] == "native"
        await t.put(type="video.query", text="x")
        events = await t.until("response.done")
        chunks = [base64.b64decode(e["data"]) for e in events if e["type"] == "response.output_audio.delta"]
        assert len(chunks) == 2
        assert parse_wav(chunks[0]).samples == np.arange(240, 720, dtype="<i2").tobytes()
        assert chunks[1] == encode_wav(np.arange(720, dtype="<i2").tobytes())

    await _run(engine, Voice(synthesizer=synth, native_trim_ms=10), body, modalities=["text", "audio"])
    assert synth.spoken == []


async def test_spoken_question_is_transcribed_and_asked() -> None:
    """Audio for an engine that cannot hear becomes input_audio.transcript, then the question
    (before the typed text); the engine gets text, not audio."""
    engine = ScriptedEngine(words=["ok"])

    async def body(t: MemoryTransport, ready: dict) -> None:
        assert ready["capabilities"]["voice_input"] == "fake-asr"
        await t.put(type="audio.chunk", data=b64(LOUD * 4))
        await t.put(type="video.query", text="answer briefly")
        events = await t.until("response.done")
        transcript = next(e for e in events if e["type"] == "input_audio.transcript")
        assert transcript["transcript"] == "what colour is the cup" and transcript["audio_ms"] == 128.0
        assert _kinds(events).index("input_audio.transcript") < _kinds(events).index("video.frames.consumed")

    await _run(engine, Voice(transcriber=FakeTranscriber()), body)
    user = engine.requests[-1].turns[-1].segments
    assert not any(isinstance(s, AudioSegment) for s in user)
    assert user[-1].text.endswith("what colour is the cup\nanswer briefly")


async def test_server_vad_answers_when_speech_stops_and_barge_in_interrupts() -> None:
    """With server_vad: speech start/stop events with stream times, an answer when it stops,
    and speech during that answer interrupts it before the next question is answered."""
    engine = ScriptedEngine(words=["word "] * 50, step_s=0.02)

    async def body(t: MemoryTransport, ready: dict) -> None:
        assert ready["config"]["turn_detection"]["silence_ms"] == 200
        await t.put(type="audio.chunk", data=b64(QUIET * 10 + LOUD * 10 + QUIET * 10))
        started = await t.get_type("input_audio.speech_started")
        stopped = await t.get_type("input_audio.speech_stopped")
        assert started["audio_start_ms"] == 320.0 and stopped["audio_end_ms"] == 640.0
        first = await t.get_type("response.start")
        await t.get_type("input_audio.transcript")
        await t.get_type("response.text.delta")
        await t.put(type="audio.chunk", data=b64(LOUD * 5))
        events = await t.until("response.done")
        assert events[0]["type"] == "input_audio.speech_started"
        assert events[-1]["status"] == "interrupted" and events[-1]["request_id"] == first["request_id"]
        await t.put(type="audio.chunk", data=b64(QUIET * 10))
        await t.get_type("input_audio.speech_stopped")
        second = await t.get_type("response.start")
        assert second["request_id"] != first["request_id"]
        await t.get_type("response.text.delta")  # the second answer reached the engine
        await t.put(type="response.cancel")
        await t.until("response.done")

    voice = Voice(transcriber=FakeTranscriber(), vad=LoudnessVad())
    await _run(engine, voice, body, turn_detection={"type": "server_vad", "silence_ms": 200, "prefix_padding_ms": 100})
    assert len(engine.requests) == 2 and engine.aborted
