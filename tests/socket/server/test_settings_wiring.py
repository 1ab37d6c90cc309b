"""Every Settings field reaches what it configures (max_cached_images once did not)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from server.listener import uvicorn_config
from server.settings import Settings
from tests.protocol_client import b64, connect, jpeg_frame

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.anyio


def _product_source() -> str:
    files = [*(ROOT / "server").rglob("*.py"), *(ROOT / "handlers").rglob("*.py")]
    return "\n".join(p.read_text() for p in files if p.name != "settings.py")


def test_every_setting_is_read_by_the_product() -> None:
    """Each Settings field is read (``settings.<field>``) by server or session code, not only declared."""
    source = _product_source()
    unread = [name for name in Settings.model_fields if not re.search(rf"\bsettings\.{name}\b", source)]
    assert unread == []


def test_max_cached_images_reaches_the_engine(tiny_model_dir: Path) -> None:
    """max_cached_images sizes the transformers engine's pixel cache."""
    import anyio

    from server.engines.factory import create_engine

    engine = create_engine(Settings(model=str(tiny_model_dir), max_cached_images=3))
    anyio.run(engine.start)
    try:
        assert engine.encoder is not None and engine.encoder._pixels.size == 3
    finally:
        anyio.run(engine.close)


def test_model_nice_reaches_the_models_workers(tiny_model_dir: Path) -> None:
    """model_yield_ms bounds how long a model step gives way to intake; model_nice lowers the priority of the threads torch computes on, not of the model
    thread itself (it holds the GIL) nor of the rest of the server."""
    import os

    import anyio
    import torch

    from server.engines.factory import create_engine
    from server.engines.base import ChatTurn, Prompt, TextSegment

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base + 7 > 19:
        pytest.fail("the test process already runs at nice %d" % base)

    def niced() -> set[int]:
        found = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                if os.getpriority(os.PRIO_PROCESS, int(tid)) == base + 7:
                    found.add(int(tid))
            except OSError:
                continue  # the thread ended
        return found

    before = niced()
    engine = create_engine(Settings(model=str(tiny_model_dir), model_nice=7, model_yield_ms=35))
    assert engine._model_thread.max_yield_s == pytest.approx(0.035)
    assert engine._model_thread.yield_to is not None

    async def use() -> None:
        await engine.start()
        await engine.prefill("s", Prompt((ChatTurn("user", (TextSegment("hello " * 64),)),), open_turn=True))

    anyio.run(use)
    try:
        thread = engine._model_thread.native_id
        assert thread is not None and os.getpriority(os.PRIO_PROCESS, thread) == base
        assert os.getpriority(os.PRIO_PROCESS, 0) == base
        assert engine._model_thread.workers_nice == base + 7
        workers = niced() - before
        assert len(workers) >= min(1, torch.get_num_threads() - 1)
    finally:
        anyio.run(engine.close)


def test_transport_settings_reach_uvicorn() -> None:
    """The one uvicorn configuration carries the WebSocket settings (CLI, tests and benches share it)."""
    settings = Settings(
        max_message_bytes=123_456, ws_ping_interval_s=7.5, ws_ping_timeout_s=9.5, ws_compression=True,
        max_send_buffer_bytes=777_777, send_timeout_s=4.5, host="127.0.0.2", port=9123, log_level="debug",
    )
    config = uvicorn_config(object(), settings)
    assert (config.host, config.port, config.log_level) == ("127.0.0.2", 9123, "debug")
    assert config.ws_max_size == 123_456
    assert (config.ws_ping_interval, config.ws_ping_timeout) == (7.5, 9.5)
    assert config.ws_per_message_deflate is True
    assert config.ws.max_send_buffer_bytes == 777_777 and config.ws.send_timeout_s == 4.5
    assert uvicorn_config(object(), settings, port=0).port == 0


def _jpeg_of(size: tuple[int, int]) -> str:
    return b64(jpeg_frame(1, size=size))


async def test_image_limits_reach_intake(tiny_model_dir: Path) -> None:
    """max_image_pixels and max_image_aspect_ratio refuse frames from their headers."""
    from server.background import run_server

    settings = Settings(model=str(tiny_model_dir), max_image_pixels=50_000, max_image_aspect_ratio=2.0)
    with run_server(settings) as srv:
        client, _ = await connect(srv, enable_frame_filter=False, prefix_warmup=False)
        await client.send(type="video.frame", data=_jpeg_of((320, 240)), frame_id="big")
        error = await client.recv_type("error")
        assert error["code"] == "invalid_image" and "too large" in error["message"]
        await client.send(type="video.frame", data=_jpeg_of((300, 100)), frame_id="long")
        error = await client.recv_type("error")
        assert error["code"] == "invalid_image" and "elongated" in error["message"]
        await client.send(type="video.frame", data=_jpeg_of((200, 150)), frame_id="small")
        ack = await client.recv_type("video.frame.ack")
        assert ack["frame_id"] == "small" and ack["accepted"] is True
        await client.ws.close()


async def test_shedding_settings_reach_intake(tiny_model_dir: Path) -> None:
    """intake_max_wait_ms and the read-ahead budgets shed frames with an overloaded ack."""
    from server.background import run_server

    with run_server(Settings(model=str(tiny_model_dir), intake_max_wait_ms=0.001)) as srv:
        client, _ = await connect(srv, enable_frame_filter=False, prefix_warmup=False)
        ack = await client.frame("late", seed=1)
        assert ack["accepted"] is False and ack["reason"] == "overloaded"
        await client.ws.close()
    with run_server(Settings(model=str(tiny_model_dir), max_server_read_ahead_bytes=2048)) as srv:
        client, _ = await connect(srv, enable_frame_filter=False, prefix_warmup=False)
        ack = await client.frame("big-for-the-server", seed=1)
        assert ack["accepted"] is False and ack["reason"] == "overloaded"
        await client.ws.close()
    with run_server(Settings(model=str(tiny_model_dir), max_read_ahead_bytes=2048)) as srv:
        client, _ = await connect(srv, enable_frame_filter=False, prefix_warmup=False)
        ack = await client.frame("big-for-the-session", seed=1)
        assert ack["accepted"] is False and ack["reason"] == "overloaded"
        await client.ws.close()


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    """`livesight serve --help` prints a flag for every setting (a "%" in a description once broke it)."""
    from server.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert all("--" + name.replace("_", "-") in out for name in Settings.model_fields)
