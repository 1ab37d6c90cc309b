"""What ``livesight stream`` runs: a source played into a ``StreamClient`` at its own pace
(``speed`` times real time), questions asked at chosen video times, and the answers printed
as they stream."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from server.client.sources import SourceFrame, encode_jpeg, open_source
from server.client.stream import Answer, AnswerListener, FrameStats, StreamClient


@dataclass(frozen=True)
class Question:
    """A question to ask; ``at_s`` is its video time, or None for "after the last frame"."""

    text: str
    at_s: float | None = None

    @classmethod
    def parse(cls, spec: str) -> Question:
        """``"3.5:what now?"`` asks at 3.5 s of video time; plain text asks at the end."""
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)s?:(.*)", spec, re.DOTALL)
        if match and match.group(2).strip():
            return cls(match.group(2).strip(), float(match.group(1)))
        return cls(spec.strip())


@dataclass
class StreamReport:
    frames: FrameStats
    answers: list[Answer]
    duration_s: float
    video_time_s: float


class ConsolePrinter:
    """Prints each answer as it streams, then its timings."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def started(self, answer: Answer) -> None:
        at = "" if answer.video_time_s is None else f" [at {answer.video_time_s:.1f} s]"
        self.out.write(f"\nQ{at}: {answer.question}\nA: ")
        self.out.flush()

    def text(self, answer: Answer, delta: str) -> None:
        self.out.write(delta)
        self.out.flush()

    def finished(self, answer: Answer) -> None:
        if answer.status == "refused":
            self.out.write(f"\nQ: {answer.question}\n   (not answered: {answer.error})\n")
            return
        newest = "" if answer.latest_pts_ms is None else f" up to {answer.latest_pts_ms / 1000:.1f} s"
        ttft = "–" if answer.ttft_ms is None else f"{answer.ttft_ms:.0f} ms"
        total = "–" if answer.total_ms is None else f"{answer.total_ms:.0f} ms"
        self.out.write(
            f"\n   ({answer.status}; ttft {ttft}, total {total}, {answer.frames_used} frames{newest}, "
            f"{answer.usage.get('completion_tokens', 0)} tokens)\n"
        )
        self.out.flush()


async def stream_source(
    client: StreamClient,
    frames: Iterable[SourceFrame],
    questions: Iterable[Question] = (),
    *,
    speed: float = 1.0,
    quality: int = 80,
    max_side: int = 640,
    listener: AnswerListener | None = None,
    answer_timeout_s: float = 300,
) -> StreamReport:
    """Play ``frames`` into ``client`` at ``speed`` times real time (0: as fast as possible).

    A timed question is sent once every frame up to its time has been sent, so it sees
    them; the frames go on while it is answered. Untimed questions are asked one after the
    other once the source has ended. Returns when every answer is done.
    """
    questions = list(questions)
    timed = deque(sorted((q for q in questions if q.at_s is not None), key=lambda q: q.at_s))
    untimed = [q for q in questions if q.at_s is None]
    answers: list[Answer] = []
    started = time.perf_counter()
    iterator = iter(frames)
    video_time = 0.0

    while True:
        frame = await asyncio.to_thread(next, iterator, None)  # decoding blocks: keep it off the loop
        if frame is None:
            break
        while timed and timed[0].at_s < frame.pts_s:
            question = timed.popleft()
            await _sleep_until(started, question.at_s, speed)
            answers.append(await client.ask(question.text, listener=listener, video_time_s=question.at_s))
        await _sleep_until(started, frame.pts_s, speed)
        jpeg = await asyncio.to_thread(encode_jpeg, frame.image, quality, max_side)
        await client.send_frame(jpeg, pts_ms=round(frame.pts_s * 1000, 3))
        video_time = frame.pts_s

    for question in [*timed, *untimed]:
        if answers:
            await answers[-1].wait(answer_timeout_s)
        answers.append(await client.ask(question.text, listener=listener, video_time_s=question.at_s))
    for answer in answers:
        await answer.wait(answer_timeout_s)
    return StreamReport(client.frames, answers, time.perf_counter() - started, video_time)


async def _sleep_until(started: float, video_time_s: float, speed: float) -> None:
    """Wait for ``video_time_s`` of the source, played at ``speed`` (0: do not wait)."""
    if speed > 0:
        delay = started + video_time_s / speed - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def run_stream(
    source: Path,
    url: str,
    questions: list[Question],
    *,
    config: dict[str, Any],
    fps: float = 2.0,
    speed: float = 1.0,
    quality: int = 80,
    max_side: int = 640,
    api_key: str | None = None,
    out: TextIO | None = None,
) -> StreamReport:
    """``livesight stream``: play ``source`` to the server at ``url``, print the answers.

    Raises ``StreamError``, ``OSError``, ``FileNotFoundError`` or ``ValueError``.
    """
    out = out or sys.stdout
    frames = open_source(source, fps)
    printer = ConsolePrinter(out)
    async with StreamClient.connect(url, config, api_key=api_key) as client:
        for note in client.ready.notes:
            out.write(f"note: {note}\n")
        report = await stream_source(
            client, frames, questions, speed=speed, quality=quality, max_side=max_side, listener=printer
        )
        await client.finish()
    stats = report.frames
    shed = f", {stats.shed} shed by the busy server" if stats.shed else ""
    out.write(
        f"\nsent {stats.sent} frames ({stats.accepted} accepted, {stats.filtered} filtered{shed}) "
        f"covering {report.video_time_s:.1f} s of video in {report.duration_s:.1f} s\n"
    )
    return report
