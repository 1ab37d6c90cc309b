"""The Python clients against the real server: ``Connection`` in one session, ``livesight stream``
with a video file and an image folder."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from handlers.wire.protocol import ResponseDone, SessionReady
from server.background import RunningServer
from server.cli import main
from server.client.connection import Connection, StreamError
from server.client.runner import Question, stream_source
from server.client.sources import folder_frames, video_frames
from server.client.stream import StreamClient
from tests.protocol_client import jpeg_frame

CONFIG = {"enable_frame_filter": False, "sampling": {"max_tokens": 6}}


def moving_square(index: int, size: tuple[int, int] = (320, 240)) -> np.ndarray:
    """A gradient with a square that moves a little every frame."""
    width, height = size
    frame = np.zeros((height, width, 3), np.uint8)
    frame[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    frame[..., 2] = np.linspace(255, 0, height, dtype=np.uint8)[:, None]
    x = (index * 9) % (width - 60)
    frame[90:150, x : x + 60] = (250, 250, 40)
    return frame


@pytest.fixture(scope="module")
def video_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3 s, 10 fps, 320x240 MPEG-4 file written with PyAV."""
    path = tmp_path_factory.mktemp("video") / "square.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for index in range(30):
            frame = av.VideoFrame.from_ndarray(moving_square(index), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Five pictures, named so that their order is their name order."""
    for index in range(5):
        Image.fromarray(moving_square(index * 5, (160, 120))).save(tmp_path / f"frame-{index:03d}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


def test_video_frames_are_sampled_at_the_requested_rate(video_file: Path) -> None:
    """A 10 fps file sampled at 4 fps gives frames every 0.25 s of video time (0 = every frame)."""
    sampled = list(video_frames(video_file, fps=4))
    assert [f.pts_s for f in sampled] == pytest.approx([i * 0.25 for i in range(12)], abs=0.051)
    assert sampled[0].image.size == (320, 240)
    assert len(list(video_frames(video_file, fps=0))) == 30


def test_question_parse() -> None:
    """'3.5:TEXT' is timed; plain text (even with a colon later) is asked at the end."""
    assert Question.parse("3.5:what now?") == Question("what now?", 3.5)
    assert Question.parse("2s: and here?") == Question("and here?", 2.0)
    assert Question.parse("what is this: a cat?") == Question("what is this: a cat?")


@pytest.mark.anyio
async def test_stream_video_file_with_timed_and_final_questions(server: RunningServer, video_file: Path) -> None:
    """A video is played at 10x speed; the timed question sees the frames up to its time, the final one all."""
    async with StreamClient.connect(server.ws_url, CONFIG) as client:
        report = await stream_source(
            client,
            video_frames(video_file, fps=4),
            [Question("what is at the end?"), Question("what moves?", 1.0)],
            speed=10,
            quality=70,
            max_side=160,
        )
        await client.finish()
    assert report.frames.sent == 12 and report.frames.accepted == 12 and report.frames.filtered == 0
    assert report.duration_s >= 2.75 / 10
    timed, final = report.answers
    assert timed.question == "what moves?" and timed.video_time_s == 1.0
    assert timed.status in {"completed", "interrupted"}
    assert timed.latest_pts_ms is not None and timed.latest_pts_ms <= 1000
    assert final.status == "completed" and final.latest_pts_ms == pytest.approx(2750, abs=51)
    assert final.frames_used >= 1 and final.usage["completion_tokens"] >= 1
    assert 0 < final.ttft_ms <= final.total_ms
    assert final.server_timings["ttft_ms"] > 0


@pytest.mark.anyio
async def test_stream_image_folder(server: RunningServer, image_folder: Path) -> None:
    """The images of a folder are sent in name order, one every 1/fps of video time."""
    assert [f.pts_s for f in folder_frames(image_folder, fps=2)] == [0, 0.5, 1.0, 1.5, 2.0]
    async with StreamClient.connect(server.ws_url, CONFIG) as client:
        report = await stream_source(client, folder_frames(image_folder, fps=2), [Question("what?")], speed=0)
    assert report.frames.sent == 5 and report.frames.accepted == 5
    (answer,) = report.answers
    assert answer.status == "completed" and answer.latest_pts_ms == 2000 and answer.frames_used >= 1


@pytest.mark.anyio
async def test_question_without_frames_is_refused_and_session_goes_on(server: RunningServer) -> None:
    """A question before any frame ends as 'refused' with no_frames; a later one is answered."""
    async with StreamClient.connect(server.ws_url, CONFIG) as client:
        refused = await (await client.ask("anything?")).wait(30)
        assert refused.status == "refused" and refused.error.startswith("no_frames")
        await client.send_frame(jpeg_frame(3), pts_ms=0)
        answered = await (await client.ask("and now?")).wait(60)
        assert answered.status == "completed" and answered.frame_ids == [1]


@pytest.mark.anyio
async def test_refused_session_raises(server: RunningServer) -> None:
    """An invalid session.config raises StreamError with the server's code."""
    with pytest.raises(StreamError) as info:
        async with StreamClient.connect(server.ws_url, {"max_frames": 0}):
            pass
    assert info.value.code == "invalid_config"


def test_cli_stream_prints_answers_with_timings(
    server: RunningServer, video_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`livesight stream FILE --ask ...` prints each answer with ttft, total and frames used."""
    argv = [
        "stream",
        str(video_file),
        "--url",
        server.ws_url,
        "--fps",
        "2",
        "--speed",
        "0",
        "--ask",
        "1.5:what is there?",
        "--ask",
        "and now?",
        "--max-tokens",
        "4",
        "--no-frame-filter",
        "--api-key",
        "k&y",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Q [at 1.5 s]: what is there?" in out and "Q: and now?" in out
    assert out.count("ttft ") == 2 and "frames up to 1.5 s" in out
    assert "sent 6 frames (6 accepted, 0 filtered)" in out


def test_cli_stream_reports_a_missing_source(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing source is an error message and exit status 1, not a traceback."""
    assert main(["stream", str(tmp_path / "nope.mp4"), "--url", server.ws_url]) == 1
    assert "no such file" in capsys.readouterr().err


@pytest.mark.anyio
async def test_a_session_with_the_real_server(server: RunningServer) -> None:
    """Connection.open gives a typed session.ready; frames are acked, a timed question ends
    in response.done with its first output before it; a refused config raises StreamError."""
    conn, ready = await Connection.open(server.ws_url, {"sampling": {"max_tokens": 3}, "prefix_warmup": False})
    try:
        assert isinstance(ready.event, SessionReady) and ready.data["session_id"] == ready.event.session_id
        for i in range(2):
            await conn.send_frame(jpeg_frame(700 + i), frame_id=i, pts_ms=i * 500)
        acks = await conn.wait_acks(2)
        assert [a.frame_id for a in acks] == [0, 1]
        answer = await conn.ask_timed("What is it?", 120)
        assert isinstance(answer.done, ResponseDone) and answer.done.status == "completed"
        assert 0 < answer.first_output_ms
    finally:
        await conn.close()
    with pytest.raises(StreamError) as refused:
        await Connection.open(server.ws_url, {"max_frames": 0})
    assert refused.value.code == "invalid_config"
