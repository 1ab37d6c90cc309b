"""The voice pieces without a socket: sentence splitting, WAV and resampling, trimming,
turn detection, and the core's voice decisions (paths, spoken questions, transcripts)."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from handlers.core.microphone import SpokenQuestion
from handlers.core.session_core import Limits, SessionCore, VoicePaths
from handlers.wire.protocol import SessionConfig, VideoQuery
from handlers.core.native_audio import NativeAudioTrim
from handlers.session.voice import SentenceSplitter, speakable
from handlers.core.turn_detection import SpeechStarted, SpeechStopped, TurnDetector
from server.engines.base import Capabilities
from server.speech.wav import Pcm, encode_wav, parse_wav, resample, trim_leading
from tests.protocol_client import b64, jpeg_frame

LIMITS = Limits(
    max_frame_bytes=1 << 20, max_audio_bytes=64_000, max_queue=10, idle_timeout_s=5, max_history_turns=2,
    max_answer_tokens=64,
)
SPEAKING = VoicePaths(output="espeak", input="pocketsphinx", vad_window=512, default_voice="en-us",
                      knows_voice=lambda v: v in {"en-us", "de"})


def _split(deltas: list[str], max_chars: int = 240) -> list[str]:
    splitter = SentenceSplitter(max_chars)
    out = []
    for delta in deltas:
        out += splitter.feed(delta)
    return out + splitter.flush()


# ---------------------------------------------------------------------- sentences


def test_sentences_complete_as_soon_as_the_next_word_starts() -> None:
    """A sentence is handed over on the delta that ends it, not at the end of the answer."""
    splitter = SentenceSplitter(240)
    assert splitter.feed("The cup is") == []
    assert splitter.feed(" red.") == []  # "red." could still be "red.5"
    assert splitter.feed(" A man") == ["The cup is red."]
    assert splitter.feed(" waves!\nThen") == ["A man waves!"]
    assert splitter.flush() == ["Then"]


def test_abbreviations_numbers_and_markup_do_not_split_or_get_spoken() -> None:
    """Dr., e.g., decimals and list numbers stay inside their sentence; markup is not read."""
    out = _split(["I see Dr. Smith, e.g. a doctor. ", "It costs 3.5 euros. ", "1. **Open** the `door`.", " Done"])
    assert out == ["I see Dr. Smith, e.g. a doctor.", "It costs 3.5 euros.", "1. Open the door .", "Done"]
    assert speakable("*** \x00 \ufffd ###") == ""


def test_long_text_is_cut_at_a_clause_then_a_word() -> None:
    """Pending text never exceeds the bound: cut after a comma, else at a space."""
    text = "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen fifteen"
    pieces = _split([text], max_chars=40)
    assert pieces[0] == "one two three four five six seven,"
    assert all(len(p) <= 40 for p in pieces) and " ".join(pieces) == text
    assert all(len(p) <= 12 for p in _split(["x" * 50], max_chars=12))


# ---------------------------------------------------------------------- WAV and resampling


def test_wav_round_trip_is_readable_by_the_wave_module() -> None:
    """encode_wav writes a valid 24 kHz mono PCM16 header whose sizes match the samples."""
    pcm = np.arange(-500, 500, dtype="<i2").tobytes()
    data = encode_wav(pcm)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == (24_000, 1, 2, 1000)
        assert w.readframes(1000) == pcm
    assert parse_wav(data) == Pcm(pcm, 24_000)
    with pytest.raises(ValueError):
        parse_wav(b"RIFF0000WAVEjunk")


def test_resampling_keeps_pitch_and_duration() -> None:
    """22,050 Hz -> 24 kHz: a 1 kHz tone stays 1 kHz, the length scales by 24000/22050."""
    t = np.arange(22_050) / 22_050
    tone = (8000 * np.sin(2 * np.pi * 1000 * t)).astype("<i2").tobytes()
    out = resample(Pcm(tone, 22_050), 24_000)
    y = np.frombuffer(out.samples, "<i2").astype(float)
    assert out.rate == 24_000 and abs(len(y) - 24_000) <= 1
    spectrum = np.abs(np.fft.rfft(y[2000:-2000] * np.hanning(len(y) - 4000)))
    peak_hz = np.argmax(spectrum) * 24_000 / (len(y) - 4000)
    assert abs(peak_hz - 1000) < 5
    assert 7600 < np.abs(y[2000:-2000]).max() < 8400  # no gain change


def test_native_audio_is_trimmed_once_per_answer() -> None:
    """The first N ms go (across chunks if needed); later chunks pass byte for byte."""
    ten_ms = bytes(480)
    first, second, third = encode_wav(ten_ms), encode_wav(ten_ms * 2), encode_wav(ten_ms)
    trim = NativeAudioTrim(15)
    assert trim.apply(first) == b""
    assert parse_wav(trim.apply(second)).duration_s == pytest.approx(0.015)
    assert trim.apply(third) == third
    assert NativeAudioTrim(5).apply(b"not a wav") == b"not a wav"
    assert trim_leading(third, 0)[0] == third


# ---------------------------------------------------------------------- turn detection


def test_turn_detector_start_hysteresis_and_stop() -> None:
    """Speech starts at the first window over the threshold, survives dips above the lower
    threshold, and stops after silence_ms below it; times are window boundaries."""
    detector = TurnDetector(threshold=0.5, silence_ms=100, window_samples=512)  # 100 ms ~ 3.1 windows
    probs = [0.1, 0.2, 0.9, 0.4, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1]
    events = detector.feed(probs[:5]) + detector.feed(probs[5:])
    assert events == [SpeechStarted(1024), SpeechStopped(1024, 2560, 4608)]
    assert events[1].end_ms == 160.0 and not detector.speaking


# ---------------------------------------------------------------------- the core's voice decisions


def _core(paths: VoicePaths = SPEAKING, **config) -> SessionCore:
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), paths)
    core.configure(SessionConfig(**config))
    return core


def test_speech_stage_makes_audio_available_and_says_which_path() -> None:
    """An engine without a voice still answers in audio when a synthesizer runs; unknown
    voices fall back to the default with a note; no stage at all keeps answers text only."""
    core = SessionCore("s1", LIMITS, Capabilities(name="x", model="m"), SPEAKING)
    ready = core.configure(SessionConfig(modalities=["text", "audio"], voice="alloy", speech_rate=1.5))
    assert ready.config["modalities"] == ["text", "audio"] and ready.config["voice"] == "en-us"
    assert ready.config["speech_rate"] == 1.5 and any("alloy" in n for n in ready.notes)
    caps = ready.capabilities
    assert caps["audio_output"] and caps["voice_output"] == "espeak" and caps["voice_input"] == "pocketsphinx"
    assert caps["turn_detection"] == ["server_vad"]
    native = SessionCore("s2", LIMITS, Capabilities(name="omni", model="m", audio_output=True), None)
    assert native.configure(SessionConfig(modalities=["text", "audio"])).capabilities["voice_output"] == "native"
    bare = SessionCore("s3", LIMITS, Capabilities(name="x", model="m"), VoicePaths())
    ready = bare.configure(SessionConfig(modalities=["text", "audio"], turn_detection={"type": "server_vad"}))
    assert ready.config["modalities"] == ["text"] and ready.config["turn_detection"] is None
    assert any("audio output" in n for n in ready.notes) and any("turn detection" in n for n in ready.notes)


def test_turn_detection_config_validates_and_takes_openai_names() -> None:
    """turn_detection has bounded fields and accepts silence_duration_ms."""
    config = SessionConfig(turn_detection={"type": "server_vad", "silence_duration_ms": 700, "threshold": 0.6})
    assert config.turn_detection.silence_ms == 700 and config.turn_detection.prefix_padding_ms == 300
    with pytest.raises(ValueError):
        SessionConfig(turn_detection={"type": "server_vad", "threshold": 2})


def test_spoken_question_keeps_padding_and_idle_audio_stays_bounded() -> None:
    """While nobody speaks only the padding is kept; a stop yields the audio from padding
    before the start to where the silence ended; it becomes a query with that audio."""
    core = _core(turn_detection={"type": "server_vad", "silence_ms": 100, "prefix_padding_ms": 64})
    window = b"\x01\x00" * 512
    core.add_audio(b64(window * 10))
    core.detect_turns([0.0] * 10)
    assert len(core.mic.buffer) == 2 * 1024  # 64 ms of padding
    core.add_audio(b64(window * 10))
    out = core.detect_turns([0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0])
    assert [type(o) for o in out] == [SpeechStarted, SpeechStopped, SpokenQuestion]
    question = out[2]
    assert question.start_ms == 320.0 and question.end_ms == 416.0
    assert len(question.pcm16) == 2 * (512 * 17 - (512 * 10 - 1024))  # from start-64 ms to the stop
    core.accept_frame(*_frame_args(1))
    plan = core.plan_spoken_query(question)
    assert plan.audio is not None and plan.audio.pcm16 == question.pcm16 and core.needs_transcription(plan)
    event = plan.transcribed("what is that")
    assert plan.question == "what is that" and plan.audio is None and event.transcript == "what is that"


def test_transcript_comes_before_typed_text_and_vad_owns_the_buffer() -> None:
    """A typed question follows the spoken one; with turn detection a video.query takes only
    its own audio_data."""
    core = _core()
    core.accept_frame(*_frame_args(1))
    core.add_audio(b64(b"\x01\x00" * 100))
    plan = core.plan_query(VideoQuery(type="video.query", text="in French please"))
    plan.transcribed("what colour is the cup")
    assert plan.question == "what colour is the cup\nin French please"
    vad = _core(turn_detection={"type": "server_vad"})
    vad.accept_frame(*_frame_args(2))
    vad.add_audio(b64(b"\x01\x00" * 100))
    assert vad.plan_query(VideoQuery(type="video.query", text="hi")).audio is None


def test_long_speech_keeps_the_newest_audio_instead_of_failing() -> None:
    """With turn detection a long utterance drops its oldest audio rather than raising overflow."""
    core = _core(turn_detection={"type": "server_vad"})
    core.detect_turns([])
    core.detector.speech_start = 0  # somebody is speaking
    for _ in range(5):
        core.add_audio(b64(bytes(20_000)))
    assert len(core.mic.buffer) <= LIMITS.max_audio_bytes and core.mic.total == 50_000
    assert core.mic.origin == core.mic.total - len(core.mic.buffer) // 2


def _frame_args(seed: int):
    from handlers.core.frames import content_key
    from handlers.wire.protocol import VideoFrame
    from handlers.media.similarity import thumbnail

    data = jpeg_frame(seed)
    event = VideoFrame(type="video.frame", data=b64(data), frame_id=seed)
    return event, data, content_key(data), thumbnail(data), 1000.0


# ---------------------------------------------------------------------- remote stages


@pytest.mark.anyio
async def test_remote_speech_and_transcription_speak_openai_audio_api() -> None:
    """Remote stages post OpenAI-style requests; a 16 kHz WAV reply is resampled to 24 kHz;
    HTTP failures become SpeechError."""
    import httpx

    from server.speech.base import SpeechError
    from server.speech.remote import RemoteSynthesizer, RemoteTranscriber

    seen: list[httpx.Request] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/audio/speech":
            return httpx.Response(200, content=encode_wav(bytes(3200), 16_000))
        if request.url.path == "/v1/audio/transcriptions":
            return httpx.Response(200, json={"text": " what is on the table "})
        return httpx.Response(503)

    transport = httpx.MockTransport(reply)
    synth = RemoteSynthesizer("http://tts:8001", "tts-1", None, api_key="k", transport=transport)
    asr = RemoteTranscriber("http://asr:8002/v1", "whisper-1", transport=transport)
    await synth.start()
    await asr.start()
    try:
        pcm = await synth.synthesize("Hello.", "nova", 1.25)
        assert len(pcm) == 2 * 2400  # 100 ms at 24 kHz
        body = seen[0].read()
        assert b'"voice":"nova"' in body and b'"speed":1.25' in body and seen[0].headers["authorization"] == "Bearer k"
        assert await asr.transcribe(bytes(3200)) == "what is on the table"
        assert b'name="model"' in seen[1].read() and synth.knows_voice("anything")
        broken = RemoteSynthesizer("http://tts:8001/x", "tts-1", None, transport=transport)
        await broken.start()
        with pytest.raises(SpeechError):
            await broken.synthesize("Hello.", "nova", 1.0)
        await broken.close()
    finally:
        await synth.close()
        await asr.close()
