"""Intake pieces without a socket: budgets, admission, the fair decode pool, header checks."""

from __future__ import annotations

import io
import threading
import time

import anyio
import numpy as np
import pytest
from PIL import Image

from server import blocking
from handlers.media.decoder import decode_image, read_header
from handlers.wire.errors import ErrorCode, SessionError
from handlers.media.preparation import prepare_frame
from handlers.session.intake import Admission, IntakeLimits, ReadAhead
from handlers.media.similarity import similarity, thumbnail, thumbnail_of
from tests.protocol_client import b64, jpeg_frame

pytestmark = pytest.mark.anyio


def test_read_ahead_budget() -> None:
    """The server-wide read-ahead budget refuses what does not fit and takes back what is given."""
    budget = ReadAhead(100)
    assert budget.take(60) and not budget.take(50) and budget.used == 60
    budget.give(60)
    assert budget.take(100) and budget.used == 100


async def test_admission_pushes_out_the_longest_waiting_connection() -> None:
    """A full pending pool cancels the wait of the connection that waited longest; slots are separate."""
    admission = Admission(max_sessions=1, max_pending=2)
    results: dict[str, bool] = {}

    async def wait(key: str) -> None:
        with admission.waiting(key) as scope:
            await anyio.sleep(5)
        results[key] = scope.cancelled_caught

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "a")
        await anyio.sleep(0.01)
        tg.start_soon(wait, "b")
        await anyio.sleep(0.01)
        assert admission.pending == 2
        tg.start_soon(wait, "c")
        await anyio.sleep(0.05)
        assert results == {"a": True} and admission.was_pushed_out("a") and not admission.was_pushed_out("b")
        tg.cancel_scope.cancel()
    assert admission.claim("b") and not admission.claim("c")
    admission.release("b")
    assert admission.claim("c")


async def test_new_connections_are_set_up_a_few_at_a_time() -> None:
    """A storm of connections takes turns: at most ``setups`` are set up at once, and every
    one of them gets its turn (a turn is held only for the setup work)."""
    admission = Admission(max_sessions=100, max_pending=100, setups=2)
    running, most, done = 0, 0, 0

    async def set_up() -> None:
        nonlocal running, most, done
        async with admission.setting_up():
            running += 1
            most = max(most, running)
            await anyio.sleep(0.001)
            running -= 1
        done += 1

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(set_up)
    assert most == 2 and done == 20


def test_header_checks_refuse_before_decoding() -> None:
    """Pixel count and aspect ratio are refused from the header, with a message a client may read."""
    limits = IntakeLimits(max_image_pixels=10_000, max_image_aspect_ratio=4)
    buf = io.BytesIO()
    Image.new("RGB", (400, 10)).save(buf, "PNG")
    with pytest.raises(SessionError) as err:
        prepare_frame(b64(buf.getvalue()), "x", limits, 597)
    assert err.value.code.value == "invalid_image" and "elongated" in err.value.message
    with pytest.raises(SessionError) as err:
        prepare_frame(b64(jpeg_frame(1, size=(320, 240))), 7, limits, 597)
    assert "too large" in err.value.message and err.value.frame_id == "7"
    assert read_header(jpeg_frame(1, size=(320, 240))).pixels == 76_800


def test_prepare_frame_keeps_a_jpeg_encoded_with_its_thumbnail() -> None:
    """A plain JPEG is held as its bytes (no pixels at intake) and decodes, when read, at most
    at the model's size and as ``decode_image`` decodes it; its thumbnail is like the
    reduced-decode one."""
    raw = jpeg_frame(3, size=(640, 480))
    prepared = prepare_frame(b64(raw), None, IntakeLimits(), 320)
    assert not prepared.heavy and prepared.image is not None
    assert prepared.image.lazy and prepared.image.held_bytes == len(raw)
    pixels = prepared.image.pixels()
    assert max(pixels.shape) <= 400 and np.array_equal(pixels, decode_image(raw, 320))
    assert prepared.thumb is not None and prepared.thumb.colour.shape == (32, 32, 3)
    assert similarity(prepared.thumb, thumbnail(raw)) > 0.95
    other = prepare_frame(b64(jpeg_frame(4, size=(640, 480))), None, IntakeLimits(), 320)
    assert similarity(prepared.thumb, other.thumb) < 0.9


def test_images_turbojpeg_cannot_take_are_decoded_at_intake() -> None:
    """PNG and a JPEG libjpeg-turbo warns about are decoded once at intake and hold their
    pixels; a truncated JPEG is refused at intake, though only its 1/8 scale is decoded."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, "PNG")
    png = prepare_frame(b64(buf.getvalue()), None, IntakeLimits(), 597)
    assert png.image is not None and not png.image.lazy and png.image.pixels().shape == (48, 64, 3)
    raw = jpeg_frame(5, size=(640, 480))
    with pytest.raises(SessionError) as refused:
        prepare_frame(b64(raw[: len(raw) // 2]), "t", IntakeLimits(), 597)
    assert refused.value.code == ErrorCode.INVALID_IMAGE and refused.value.frame_id == "t"
    marker = raw.index(b"\xff\xdb")  # stray bytes before a marker: libjpeg warns, Pillow decides
    prepared = prepare_frame(b64(raw[:marker] + b"\x12\x34" + raw[marker:]), None, IntakeLimits(), 597)
    assert prepared.image is not None and not prepared.image.lazy


def test_png_above_a_quarter_of_the_heavy_limit_is_heavy() -> None:
    """PNG/WebP are heavy from a quarter of heavy_image_pixels (no reduced decode), JPEG from the limit."""
    limits = IntakeLimits(heavy_image_pixels=100_000)
    buf = io.BytesIO()
    Image.new("RGB", (200, 200)).save(buf, "PNG")
    png = prepare_frame(b64(buf.getvalue()), None, limits, 597)
    assert png.heavy and png.image is None
    jpeg = prepare_frame(b64(jpeg_frame(1, size=(200, 200))), None, limits, 597)
    assert not jpeg.heavy and jpeg.image is not None


def test_thumbnail_of_ignores_noise() -> None:
    """The sparse-grid thumbnail sees sensor noise as no change."""
    rng = np.random.default_rng(0)
    base = np.asarray(Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).resize((640, 480)))
    noisy = np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)
    assert similarity(thumbnail_of(base), thumbnail_of(noisy)) > 0.98


async def test_heavy_jobs_never_hold_every_thread() -> None:
    """With two threads, heavy decodes run one at a time and a light job still starts at once."""
    blocking.configure(2)
    running, peak, lock = [0], [0], threading.Lock()

    def heavy() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    light_wait: list[float] = []

    async def light() -> None:
        await anyio.sleep(0.05)
        asked = time.perf_counter()
        await blocking.run_fair(lambda: None)
        light_wait.append(time.perf_counter() - asked)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(lambda: blocking.run_fair(heavy, heavy=True))
        tg.start_soon(light)
    assert peak[0] == 1
    assert light_wait[0] < 0.15  # not behind the 3 x 0.2 s of heavy work


async def test_job_past_its_deadline_is_not_run() -> None:
    """A job that cannot start before its deadline raises Overloaded and never runs."""
    blocking.configure(1)
    ran: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: blocking.run_fair(time.sleep, 0.3))
            await anyio.sleep(0.05)
            with pytest.raises(blocking.Overloaded):
                await blocking.run_fair(ran.append, "late", deadline=time.perf_counter() + 0.05)
        assert ran == []
    finally:
        blocking.configure(2)


async def test_cancelled_caller_waits_for_its_running_job() -> None:
    """A frame job that already started is awaited when its session is cancelled: nothing outlives the session."""
    finished: list[bool] = []

    def job() -> None:
        time.sleep(0.2)
        finished.append(True)

    with anyio.move_on_after(0.05):
        await blocking.run_fair(job)
    assert finished == [True]


async def test_cancelled_caller_takes_its_queued_job_back() -> None:
    """A caller cancelled before its job started removes it from the queue: it never runs."""
    blocking.configure(1)
    ran: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocking.run_fair, time.sleep, 0.2)
            await anyio.sleep(0.02)
            with anyio.move_on_after(0.05):
                await blocking.run_fair(ran.append, "cancelled")
        await blocking.run_fair(ran.append, "after")
        assert ran == ["after"]
    finally:
        blocking.configure(2)


def test_a_frame_read_and_not_acked_counts_as_busy() -> None:
    """A frame read from a client makes intake busy for the model thread until it is acknowledged
    (a session gone with frames queued: tests/socket/server/test_session_ws.py)."""
    assert not blocking.frames_busy()
    blocking.frame_read()
    try:
        assert blocking.frames_busy()
    finally:
        blocking.frame_done()
    assert not blocking.frames_busy()


def test_a_heavy_jpeg_turned_by_exif_is_decoded_turned() -> None:
    """A heavy JPEG with an EXIF orientation is finished on the heavy pool by a full decode
    that applies the turn; it is never held encoded (its readers would decode it unturned)."""
    from handlers.media.preparation import decode_prepared

    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG", exif=exif.tobytes())
    limits = IntakeLimits(heavy_image_pixels=1000)
    prepared = prepare_frame(b64(buf.getvalue()), None, limits, 597)
    assert prepared.heavy and prepared.image is None
    done = decode_prepared(prepared, None, limits, 597)
    assert done.image is not None and not done.image.lazy
    assert done.image.pixels().shape == (64, 48, 3)
