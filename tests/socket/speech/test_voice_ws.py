"""Voice end to end: questions spoken by eSpeak NG into the real server (tiny model,
embedded eSpeak NG, PocketSphinx and Silero VAD), answers checked as the client hears them."""

from __future__ import annotations

import base64

import anyio
import pytest

from server.background import RunningServer
from server.bench.spoken import speak_clip, wav_info
from server.bench.voice import VoiceClient, barge_in
from server.speech.base import SpeechError
from server.speech.espeak import EspeakSynthesizer

pytestmark = pytest.mark.anyio

QUESTIONS = ["what is on the table", "how many people are in the room"]


async def test_spoken_questions_are_detected_heard_and_answered_aloud(server: RunningServer) -> None:
    """server_vad finds each question within 150 ms of where the speech really is, the
    transcript holds its words, and the spoken answer is valid 24 kHz WAV whose header
    matches its samples."""
    async with VoiceClient.open(
        server.ws_url, modalities=["text", "audio"], turn_detection={"type": "server_vad"},
        sampling={"max_tokens": 24, "temperature": 0},
    ) as (client, ready):
        assert ready.capabilities["voice_output"] == "espeak" and ready.capabilities["voice_input"] == "pocketsphinx"
        await client.frame(1)
        heard_words = 0
        for i, question in enumerate(QUESTIONS):
            clip = speak_clip(question, noise=30, seed=i)
            offset_ms = client.samples_sent / 16
            mark = len(client.events)
            await client.stream_audio(clip.pcm16, chunk_ms=40, realtime=False)
            done = await client.wait_for("response.done", timeout=120, after=mark)
            events = [r.data for r in client.events[mark:]]
            kinds = [e["type"] for e in events]
            assert kinds[:3] == ["input_audio.speech_started", "input_audio.speech_stopped", "response.start"]
            stopped = events[1]
            assert abs(stopped["audio_start_ms"] - offset_ms - clip.speech_start_ms) <= 150
            assert abs(stopped["audio_end_ms"] - offset_ms - clip.speech_end_ms) <= 150
            heard = next(e for e in events if e["type"] == "input_audio.transcript")["transcript"].split()
            assert any(w in heard for w in question.split()), heard
            heard_words += sum(w in heard for w in question.split())
            assert done.data["status"] == "completed"
            deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
            assert deltas and kinds.index("response.output_audio.done") < kinds.index("response.done")
            for delta in deltas:
                rate, channels, width, frames, size = wav_info(base64.b64decode(delta["data"]))
                assert (rate, channels, width) == (24_000, 1, 2) and size == 2 * frames > 0
        # The words of both questions together: eSpeak's output varies a little from call to
        # call and PocketSphinx, on a busy host, once heard the first as "what did on that
        # signal" (it hears it right in 97 of 100 tries here; accuracy is pinned by the
        # recogniser tests).
        assert heard_words >= 0.6 * sum(len(q.split()) for q in QUESTIONS)


async def test_query_audio_is_transcribed_without_turn_detection(server: RunningServer) -> None:
    """video.query audio_data for an engine that cannot hear becomes input_audio.transcript;
    voice and speech_rate are taken from session.config."""
    async with VoiceClient.open(
        server.ws_url, modalities=["text", "audio"], voice="en-gb", speech_rate=1.3, sampling={"max_tokens": 4},
    ) as (client, ready):
        assert ready.config["voice"] == "en-gb" and ready.config["speech_rate"] == 1.3 and not ready.notes
        await client.frame(4)
        clip = speak_clip("is the door open", lead_ms=300, tail_ms=300, noise=30, seed=3)
        await client.conn.query("", audio_data=base64.b64encode(clip.pcm16).decode())
        transcript = await client.wait_for("input_audio.transcript", timeout=60)
        # At least half the words: eSpeak's output varies a little from call to call, and
        # PocketSphinx hears this short clip as "is a door open" or "is that or open" (the
        # mapping is what this pins; accuracy is pinned by the voice tests).
        heard = transcript.data["transcript"].split()
        assert sum(w in heard for w in "is the door open".split()) >= 2, heard
        assert transcript.data["audio_ms"] == pytest.approx(clip.duration_ms, abs=1)
        done = await client.wait_for("response.done", timeout=60)
        assert done.data["status"] == "completed"


async def test_barge_in_stops_the_spoken_answer(server: RunningServer) -> None:
    """Speech over a running spoken answer interrupts it within 100 ms of the audio that
    revealed it, and none of the old answer's audio follows its response.done."""
    result = await barge_in(server.ws_url)
    assert result.audio_after_done == 0
    assert abs(result.detected_error_ms) <= 150
    assert result.cutoff_ms < 100, result


async def test_espeak_voices_and_speaking_rate() -> None:
    """eSpeak NG speaks through ctypes at 24 kHz; a faster rate is shorter; languages and
    variants are voices; unknown voices are refused."""
    synth = EspeakSynthesizer()
    await synth.start()
    normal = await synth.synthesize("The cup is on the table.", "en-us", 1.0)
    fast = await synth.synthesize("The cup is on the table.", "en-us", 2.0)
    assert 0.3 < len(fast) / len(normal) < 0.75
    assert synth.knows_voice("en-gb") and synth.knows_voice("en-us+f3") and not synth.knows_voice("alloy")
    assert await synth.synthesize("Guten Tag.", "de", 1.0)
    with pytest.raises(SpeechError):
        await synth.synthesize("hello", "alloy", 1.0)
    with anyio.fail_after(5):
        assert len(await synth.synthesize("Hi.", "en-us+f3", 1.0)) % 2 == 0
