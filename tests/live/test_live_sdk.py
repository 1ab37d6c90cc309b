"""The Gemini Live endpoint driven by the real google-genai SDK (``client.aio.live.connect``)
over TLS through the real app: frames, typed and spoken questions, spoken answers,
transcriptions, interruptions, usage and resumption; every server message parses strictly
into the SDK's ``LiveServerMessage``."""

from __future__ import annotations

import pytest
from google.genai import errors, types
from websockets.exceptions import ConnectionClosed

from server.background import RunningServer
from tests.live.sdk import live_session, text_of, usage_of
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


async def test_every_api_version_path_and_the_key_in_the_query(live_server: RunningServer) -> None:
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
