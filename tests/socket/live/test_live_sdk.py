"""The Gemini Live endpoint driven by the real google-genai SDK (``client.aio.live.connect``)
over TLS through the real app: frames, typed and spoken questions, spoken answers,
transcriptions, interruptions, usage and resumption; every server message parses strictly
into the SDK's ``LiveServerMessage``."""

from __future__ import annotations

import pytest
from google.genai import errors, types
from websockets.exceptions import ConnectionClosed

from server.background import RunningServer
from tests.socket.live.sdk import live_session, text_of, usage_of
from tests.protocol_client import jpeg_frame

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("trust_live_tls")]

TEXT = {"response_modalities": ["TEXT"], "max_output_tokens": 8, "temperature": 0.0}


def frame(seed: int) -> types.Blob:
    return types.Blob(data=jpeg_frame(seed), mime_type="image/jpeg")


def ask(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def test_frames_then_a_typed_question_streams_text_and_usage(live_server: RunningServer) -> None:
    """Frames by send_realtime_input(video=...), a question by send_client_content: streamed
    text parts, generationComplete then turnComplete with usageMetadata split by modality; a
    follow-up reuses more than 90% of its prompt from the cache."""
    async with live_session(live_server, TEXT) as live:
        assert live.session.setup_complete is not None and live.session.session_id
        for seed in range(4):
            await live.session.send_realtime_input(video=frame(seed))
        await live.session.send_client_content(turns=ask("What do you see?"), turn_complete=True)
        first = await live.turn()
        parts = [m for m in first if m.server_content and m.server_content.model_turn]
        assert parts and text_of(first)
        ends = [m.server_content for m in first if m.server_content and not m.server_content.model_turn]
        assert [bool(c.generation_complete) for c in ends] == [True, False] and ends[-1].turn_complete
        usage = usage_of(first)
        assert first[-1].usage_metadata is usage  # with turnComplete: receive() ends on that message
        details = {d.modality: d.token_count for d in usage.prompt_tokens_details}
        assert details[types.MediaModality.IMAGE] > 0 and details[types.MediaModality.TEXT] > 0
        assert sum(details.values()) == usage.prompt_token_count
        assert usage.response_token_count > 0
        assert usage.total_token_count == usage.prompt_token_count + usage.response_token_count

        await live.session.send_client_content(turns=ask("And now?"), turn_complete=True)
        usage = usage_of(await live.turn())
        assert usage.cached_content_token_count > 0.9 * usage.prompt_token_count, usage
    assert live.raw  # every one was checked against LiveServerMessage


async def test_every_api_version_path(live_server: RunningServer) -> None:
    """The SDK's v1 (its default), v1beta and v1alpha paths all serve a session."""
    for version in ("v1", "v1alpha"):
        async with live_session(live_server, TEXT, api_version=version) as live:
            await live.session.send_realtime_input(video=frame(7))
            await live.session.send_realtime_input(text="Describe it.")
            assert text_of(await live.turn())


async def test_a_wrong_key_is_refused_with_its_reason(live_server: RunningServer) -> None:
    """A key the server does not hold: closed with 1008 and the reason (the server closes at
    connect, so the SDK's send of setup raises websockets' ConnectionClosed)."""
    with pytest.raises((errors.APIError, ConnectionClosed)) as refused:
        async with live_session(live_server, TEXT, api_key="not-the-key"):
            pass
    exc = refused.value
    code, reason = (exc.code, str(exc)) if isinstance(exc, errors.APIError) else (exc.rcvd.code, exc.rcvd.reason)
    assert code == 1008 and "API key" in reason


def heard(said: str, transcript: str) -> bool:
    """At least 40% of the words said are in the transcript (recognition accuracy is pinned
    elsewhere; these tests pin where the words go)."""
    words = transcript.lower().split()
    return sum(w in words for w in said.split()) >= 0.4 * len(said.split())


def audio_parts(messages: list[types.LiveServerMessage]) -> list[types.Blob]:
    return [
        part.inline_data
        for m in messages
        if m.server_content and m.server_content.model_turn
        for part in m.server_content.model_turn.parts or []
        if part.inline_data
    ]


def transcription(messages: list[types.LiveServerMessage], field: str) -> str:
    return "".join(
        getattr(m.server_content, field).text or ""
        for m in messages
        if m.server_content and getattr(m.server_content, field)
    )


async def stream(live, pcm16: bytes, rate: int = 16_000, chunk_ms: int = 40) -> None:
    """Microphone audio in real-time-sized chunks (sent as fast as the socket takes them)."""
    step = rate * 2 * chunk_ms // 1000
    for i in range(0, len(pcm16), step):
        await live.session.send_realtime_input(
            audio=types.Blob(data=pcm16[i : i + step], mime_type=f"audio/pcm;rate={rate}")
        )


AUDIO = {
    "response_modalities": ["AUDIO"], "max_output_tokens": 16, "output_audio_transcription": {},
    "speech_config": {"voice_config": {"prebuilt_voice_config": {"voice_name": "Puck"}}},
}


async def test_audio_answers_are_pcm16_at_24khz_with_their_words(live_server: RunningServer) -> None:
    """responseModalities AUDIO: inlineData audio/pcm;rate=24000 (raw PCM16, no WAV header)
    and the same answer's words as outputTranscription; no text parts."""
    async with live_session(live_server, AUDIO) as live:
        await live.session.send_realtime_input(video=frame(11))
        await live.session.send_client_content(turns=ask("Describe the picture."), turn_complete=True)
        turn = await live.turn()
        blobs = audio_parts(turn)
        assert blobs and all(b.mime_type == "audio/pcm;rate=24000" for b in blobs)
        assert all(not b.data.startswith(b"RIFF") and len(b.data) % 2 == 0 for b in blobs)
        assert sum(len(b.data) for b in blobs) > 24_000 * 2 * 0.2  # at least 0.2 s of speech
        assert transcription(turn, "output_transcription").strip()
        assert not text_of(turn)
        assert turn[-1].server_content.turn_complete and turn[-1].usage_metadata


async def test_a_spoken_question_with_automatic_activity_detection(live_server: RunningServer) -> None:
    """Speech streamed at 16 kHz (and at 24 kHz, resampled) with automatic activity
    detection: inputTranscription of the words, then the answer, with no message from the
    client but the audio."""
    from server.bench.spoken import speak_clip
    from server.speech.wav import Pcm, resample

    config = {**TEXT, "input_audio_transcription": {},
              "realtime_input_config": {"automatic_activity_detection": {"silence_duration_ms": 400}}}
    clip = speak_clip("how many people are in the room", noise=30, seed=1)
    async with live_session(live_server, config) as live:
        await live.session.send_realtime_input(video=frame(4))
        await stream(live, clip.pcm16)
        turn = await live.turn()
        assert heard(clip.text, transcription(turn, "input_transcription")), turn
        first_text = next(i for i, m in enumerate(turn) if text_of([m]))
        assert first_text > next(i for i, m in enumerate(turn) if m.server_content.input_transcription)
        assert turn[-1].server_content.turn_complete
        details = {d.modality: d.token_count for d in turn[-1].usage_metadata.prompt_tokens_details}
        assert details[types.MediaModality.AUDIO] > 0  # the words heard

        pcm24 = resample(Pcm(clip.pcm16, 16_000), 24_000).samples
        await stream(live, pcm24, rate=24_000)
        assert heard(clip.text, transcription(await live.turn(), "input_transcription"))


async def test_speech_over_an_answer_interrupts_it(live_server: RunningServer) -> None:
    """Barge-in: speech during a spoken answer ends it with interrupted; no audio of it
    follows; the words spoken over it are the next question, answered to turnComplete."""
    from server.bench.spoken import speak_clip

    config = {**AUDIO, "max_output_tokens": 1024, "input_audio_transcription": {}}
    clip = speak_clip("what is on the table", lead_ms=300, noise=30, seed=1)
    async with live_session(live_server, config) as live:
        await live.session.send_realtime_input(video=frame(3))
        await live.session.send_client_content(turns=ask("Describe it all, at length."), turn_complete=True)
        await live.until(lambda m: bool(audio_parts([m])))
        await stream(live, clip.pcm16)
        cut = await live.until(lambda m: bool(m.server_content and m.server_content.interrupted))
        assert not any(m.server_content and m.server_content.turn_complete for m in cut)
        after = await live.until(lambda m: bool(m.server_content and m.server_content.input_transcription))
        assert heard(clip.text, transcription(after, "input_transcription"))
        assert not audio_parts(after)  # nothing of the cut answer after its interrupted


async def test_manual_turns_with_activity_start_and_end(live_server: RunningServer) -> None:
    """automaticActivityDetection disabled: the audio between activityStart and activityEnd
    is the question (audio before activityStart is not); activityStart during an answer
    interrupts it (START_OF_ACTIVITY_INTERRUPTS, the default)."""
    from server.bench.spoken import speak_clip

    manual = {"realtime_input_config": {"automatic_activity_detection": {"disabled": True}},
              "input_audio_transcription": {}}
    clip = speak_clip("what is on the table", noise=30, seed=1)
    noise = speak_clip("how many people are in the room", noise=30, seed=2)
    async with live_session(live_server, {**TEXT, **manual}) as live:
        await live.session.send_realtime_input(video=frame(5))
        await stream(live, noise.pcm16)  # before activityStart: not part of the question
        await live.session.send_realtime_input(activity_start=types.ActivityStart())
        await stream(live, clip.pcm16)
        await live.session.send_realtime_input(activity_end=types.ActivityEnd())
        turn = await live.turn()
        words = transcription(turn, "input_transcription")
        assert heard(clip.text, words) and "people" not in words and text_of(turn)

    async with live_session(live_server, {**TEXT, **manual, "max_output_tokens": 1024}) as live:
        await live.session.send_realtime_input(video=frame(6))
        await live.session.send_client_content(turns=ask("Tell me everything, at length."), turn_complete=True)
        await live.until(lambda m: bool(text_of([m])))
        await live.session.send_realtime_input(activity_start=types.ActivityStart())
        ended = await live.until(
            lambda m: bool(m.server_content and (m.server_content.interrupted or m.server_content.turn_complete))
        )
        assert ended[-1].server_content.interrupted


async def test_seeded_history_joins_the_conversation(live_server: RunningServer) -> None:
    """clientContent user and model turns without turnComplete (what Pipecat sends as its
    context) join the conversation: the next question's prompt holds them."""
    prompts = []
    for history in ([], [ask("My name is Ann and I like red."),
                         types.Content(role="model", parts=[types.Part(text="Hello Ann, noted.")])]):
        async with live_session(live_server, TEXT) as live:
            if history:
                await live.session.send_client_content(turns=history, turn_complete=False)
            await live.session.send_realtime_input(video=frame(50))
            await live.session.send_client_content(turns=ask("What is it?"), turn_complete=True)
            prompts.append(usage_of(await live.turn()).prompt_token_count)
    assert prompts[1] > prompts[0] + 8, prompts


async def test_tls_serves_every_endpoint(live_server: RunningServer, trust_live_tls) -> None:
    """With a certificate, /healthz is https and protocol v1 is wss, as the Live path is."""
    import ssl

    import httpx

    from tests.protocol_client import Client

    context = ssl.create_default_context(cafile=str(trust_live_tls))
    async with httpx.AsyncClient(verify=context) as http:
        assert (await http.get(f"https://{live_server.host}:{live_server.port}/healthz")).json()["status"] == "ok"
    url = f"wss://{live_server.host}:{live_server.port}/v1/video/chat/stream?api_key=live-test-key"
    client, ready = await Client.open(url, {"sampling": {"max_tokens": 2}}, ssl=context)
    try:
        assert ready.type == "session.ready"
    finally:
        await client.close()


async def test_audio_stream_end_ends_the_speech_under_way(live_server: RunningServer) -> None:
    """The microphone stops right after the words (no silence sent): audioStreamEnd ends the
    spoken turn, which is heard and answered."""
    from server.bench.spoken import speak_clip

    config = {**TEXT, "input_audio_transcription": {}}
    clip = speak_clip("what is on the table", tail_ms=0, noise=30, seed=1)
    async with live_session(live_server, config) as live:
        await live.session.send_realtime_input(video=frame(8))
        await stream(live, clip.pcm16)
        await live.session.send_realtime_input(audio_stream_end=True)
        turn = await live.turn()
        assert heard(clip.text, transcription(turn, "input_transcription")) and text_of(turn)


def test_tls_settings_reach_uvicorn(tmp_path) -> None:
    """ssl_certfile, ssl_keyfile and the key's password reach uvicorn's configuration; a key
    without a certificate is refused; no certificate: no TLS."""
    from pydantic import ValidationError

    from server.listener import uvicorn_config
    from server.settings import Settings

    settings = Settings(ssl_certfile=tmp_path / "c.pem", ssl_keyfile=tmp_path / "k.pem", ssl_keyfile_password="pw")
    config = uvicorn_config(object(), settings)
    assert (config.ssl_certfile, config.ssl_keyfile, config.ssl_keyfile_password) == (
        str(tmp_path / "c.pem"), str(tmp_path / "k.pem"), "pw")
    assert uvicorn_config(object(), Settings()).ssl_certfile is None
    with pytest.raises(ValidationError):
        Settings(ssl_keyfile=tmp_path / "k.pem")
