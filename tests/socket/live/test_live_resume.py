"""Gemini Live sessions that do not die, with the real google-genai SDK over TLS: a dropped
connection resumed with its sessionResumptionUpdate handle (warm, every frame kept; a wrong
handle or another key's refused), and a drain (SIGTERM) that sends goAway first, lets the
answer complete, then closes."""

from __future__ import annotations

import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from google.genai import errors, types

from server.background import RunningServer, ServedProcess, serve_process
from tests.socket.live.conftest import API_KEY, OTHER_KEY
from tests.socket.live.sdk import live_session, text_of, usage_of
from tests.protocol_client import jpeg_frame

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("trust_live_tls")]

DRAIN_S = 30


def _frame(seed: int) -> types.Blob:
    return types.Blob(data=jpeg_frame(seed), mime_type="image/jpeg")


def _ask(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def _images(usage: types.UsageMetadata) -> int:
    return sum(d.token_count for d in usage.prompt_tokens_details if d.modality == types.MediaModality.IMAGE)


async def _parked(server: RunningServer, ca: Path, count: int) -> None:
    """Wait until the server holds ``count`` dropped sessions (it has noticed the drop)."""
    context = ssl.create_default_context(cafile=str(ca))
    async with httpx.AsyncClient(verify=context, headers={"x-goog-api-key": API_KEY}) as http:
        with anyio.fail_after(30):
            url = f"https://{server.host}:{server.port}/metrics.json"
            while (await http.get(url)).json()["sessions_parked"] != count:
                await anyio.sleep(0.05)


CONFIG = {"response_modalities": ["TEXT"], "max_output_tokens": 8, "session_resumption": {}}


async def test_a_dropped_session_resumes_warm_with_its_handle(live_server: RunningServer, trust_live_tls: Path) -> None:
    """sessionResumptionUpdate (newHandle, resumable) right after setupComplete; after a drop,
    a new connection with the handle gets the session back: the next question sees every frame
    sent before the drop (same image tokens) and reuses more than 90% of its prompt; its own
    update carries a new handle."""
    async with live_session(live_server, CONFIG) as live:
        for seed in range(4):
            await live.session.send_realtime_input(video=_frame(20 + seed))
        await live.session.send_client_content(turns=_ask("What is there?"), turn_complete=True)
        first = await live.turn()
        updates = [m.session_resumption_update for m in first if m.session_resumption_update]
        assert len(updates) == 1 and updates[0].resumable and updates[0].new_handle
        handle = updates[0].new_handle
        before = usage_of(first)
        live.drop()
        await _parked(live_server, trust_live_tls, 1)

    resumed = {**CONFIG, "session_resumption": {"handle": handle}}
    async with live_session(live_server, resumed) as live:
        await live.session.send_client_content(turns=_ask("And now?"), turn_complete=True)
        turn = await live.turn()
        update = next(m.session_resumption_update for m in turn if m.session_resumption_update)
        assert update.resumable and update.new_handle not in {None, handle}
        assert text_of(turn)
        usage = usage_of(turn)
        assert _images(usage) == _images(before) > 0  # no frame lost
        assert usage.cached_content_token_count > 0.9 * usage.prompt_token_count, usage
        live.drop()
        await _parked(live_server, trust_live_tls, 1)

    with pytest.raises(errors.APIError) as used:  # a handle works once
        async with live_session(live_server, resumed):
            pass
    assert used.value.code == 1008 and "resumption" in str(used.value).lower()

    with pytest.raises(errors.APIError) as other:  # the handle is bound to the key that opened it
        async with live_session(live_server, {**CONFIG, "session_resumption": {"handle": update.new_handle}},
                                api_key=OTHER_KEY):
            pass
    assert other.value.code == 1008 and "resumption" in str(other.value).lower()


async def test_a_session_closed_cleanly_is_continued_with_its_handle(live_server: RunningServer) -> None:
    """The SDK's ``async with`` twice: the first connection ends cleanly (1000, not parked), and
    its handle still opens the second, which continues its memory (no 1008); that handle then
    works no more."""
    async with live_session(live_server, CONFIG) as live:
        await live.session.send_realtime_input(video=_frame(40))
        await live.session.send_client_content(turns=_ask("What is there?"), turn_complete=True)
        first = await live.turn()
        handle = next(m.session_resumption_update for m in first if m.session_resumption_update).new_handle
    resumed = {**CONFIG, "session_resumption": {"handle": handle}}
    async with live_session(live_server, resumed) as live:
        await live.session.send_realtime_input(video=_frame(41))
        await live.session.send_client_content(turns=_ask("And now?"), turn_complete=True)
        turn = await live.turn()
        assert text_of(turn)
        update = next(m.session_resumption_update for m in turn if m.session_resumption_update)
        assert update.resumable and update.new_handle not in {None, handle}
    with pytest.raises(errors.APIError) as used:
        async with live_session(live_server, resumed):
            pass
    assert used.value.code == 1008


async def test_a_wrong_handle_is_refused(live_server: RunningServer) -> None:
    """A handle the server never gave: closed with 1008 and a reason naming resumption."""
    with pytest.raises(errors.APIError) as refused:
        async with live_session(live_server, {**CONFIG, "session_resumption": {"handle": "not-a-handle"}}):
            pass
    assert refused.value.code == 1008 and "resumption" in str(refused.value).lower()


@pytest.fixture
def served_tls(tiny_model_dir: Path, live_tls: tuple[Path, Path], tmp_path: Path) -> Iterator[ServedProcess]:
    """`livesight serve` over TLS in its own process, for SIGTERM."""
    from tests.socket.live.conftest import KEY_PASSWORD

    cert, key = live_tls
    args = ["--model", str(tiny_model_dir), "--drain-timeout-s", str(DRAIN_S), "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(key), "--ssl-keyfile-password", KEY_PASSWORD.decode()]
    with serve_process(args, log_path=tmp_path / "server.log", start_timeout_s=180, stop_timeout_s=0,
                       tls_ca=cert) as served:
        yield served


async def test_sigterm_sends_go_away_then_the_answer_completes(served_tls: ServedProcess) -> None:
    """SIGTERM during an answer: goAway (timeLeft = the drain deadline) first, the answer
    goes on to turnComplete, then the connection closes with 1012 (the SDK raises APIError)."""
    config = {"response_modalities": ["TEXT"], "max_output_tokens": 200, "temperature": 1.0, "seed": 5}
    async with live_session(served_tls, config, api_key="any") as live:
        await live.session.send_realtime_input(video=_frame(40))
        await live.session.send_client_content(turns=_ask("Describe everything at length."), turn_complete=True)
        await live.until(lambda m: bool(text_of([m])))
        served_tls.proc.send_signal(signal.SIGTERM)
        rest = await live.turn()
        away = [i for i, m in enumerate(rest) if m.go_away]
        assert away and rest[away[0]].go_away.time_left == f"{DRAIN_S}s"
        assert text_of(rest[away[0]:]) and rest[-1].server_content.turn_complete  # the answer went on
        assert rest[-1].usage_metadata.response_token_count > 0
        with pytest.raises(errors.APIError) as closed:
            await live.turn()
        assert closed.value.code == 1012
    assert served_tls.proc.wait(timeout=60) in (0, -signal.SIGTERM)
