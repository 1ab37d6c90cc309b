"""``livesight bench demo``: is the demo model right at the server's defaults, as a newcomer
would try it?

One session with the server's default config (the whole 50-frame window in every prompt) and
one alert watch, "Is the screen red?", with its defaults. The client streams a camera looking
at a screen (``server.models.colour_frames``: texture, noise and small moving objects) at
``fps``, the screen changing colour every ``scene_s`` seconds (red every other scene, another
colour between), and asks "What colour is the screen?" every ``ask_every_s`` seconds.

Frames carry their stream time (``pts_ms``); ``speed`` above 1 sends them that much faster
than real time (the suite's short run), the prompts' timestamps still at ``fps``, and the
watch's cooldown (wall time) shortened to match.

Printed: answers right (the newest frame sent before the question is the colour named), the
wrong ones with what they said, the red scenes the watch fired in, and its false fires (a fire
on a frame that is not red).
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass, field

import websockets

from handlers.wire.protocol import ResponseDone, ResponseStart, ResponseTextDelta, WatchFired, WatchSpec
from server.client.connection import Connection

QUESTION = "What colour is the screen?"
RED = "red"
OTHERS = ("green", "blue", "yellow", "white", "black", "grey")
CAMERA = (640, 480)
DEFAULT_COOLDOWN_S = float(WatchSpec.model_fields["cooldown_s"].default)
#: After the last frame, the longest wait for the answers still due.
SETTLE_S = 60.0


def script(frames: int, fps: float, scene_s: float) -> list[str]:
    """The screen's colour at each frame: red every other scene, the others in turn between."""
    per_scene = max(1, round(scene_s * fps))
    scenes = [RED if k % 2 == 0 else OTHERS[(k // 2) % len(OTHERS)] for k in range(-(-frames // per_scene))]
    return [scenes[i // per_scene] for i in range(frames)]


def clip(colours: list[str], seed: int = 11) -> list[str]:
    """The stream as base64 JPEG at ``CAMERA`` size: one scene whose screen takes ``colours``."""
    from server.models.colour_frames import moving_clip

    return [base64.b64encode(f.jpeg).decode("ascii") for f in moving_clip(colours, CAMERA, seed)]


@dataclass
class DemoRun:
    """What the session saw: each question's expected colour and answer, and the watch's fires."""

    colours: list[str]
    asked: dict[int, str] = field(default_factory=dict)  # question number -> the colour it should name
    answers: dict[int, str] = field(default_factory=dict)  # question number -> what it said
    statuses: dict[int, str] = field(default_factory=dict)
    fires: list[int] = field(default_factory=list)  # frame ids the red watch fired on

    @property
    def right(self) -> int:
        return sum(self.answers.get(n, "").strip().lower() == colour for n, colour in self.asked.items())

    @property
    def false_fires(self) -> list[int]:
        return [f for f in self.fires if self.colours[f] != RED]

    def red_scenes(self) -> list[tuple[int, int]]:
        """Each red scene as (first frame, frame after its last)."""
        out, start = [], 0
        for i in range(1, len(self.colours) + 1):
            if i == len(self.colours) or self.colours[i] != self.colours[start]:
                if self.colours[start] == RED:
                    out.append((start, i))
                start = i
        return out

    def scenes_fired(self) -> int:
        return sum(any(a <= f < b for f in self.fires) for a, b in self.red_scenes())

    def wrong(self) -> list[str]:
        return [f"#{n} {colour}: {self.answers.get(n, '(no answer)')!r} ({self.statuses.get(n, 'none')})"
                for n, colour in self.asked.items() if self.answers.get(n, "").strip().lower() != colour]


async def stream_demo(url: str, seconds: float, fps: float = 2.0, scene_s: float = 10.0, ask_every_s: float = 3.0,
                      speed: float = 1.0) -> DemoRun:
    """Stream the script into one default session at ``url`` (``ws://.../v1/video/chat/stream``)
    with a red alert watch, asking every ``ask_every_s`` of stream time; returns what it saw."""
    colours = script(int(seconds * fps), fps, scene_s)
    frames = clip(colours)
    run = DemoRun(colours)
    # the watch's defaults, its cooldown (wall time) scaled with the speed: 10 s of stream time
    watch = {"watch_id": RED, "condition": "Is the screen red?", "cooldown_s": DEFAULT_COOLDOWN_S / speed}
    conn, _ = await Connection.open(url, {"watches": [watch]})
    questions: list[int] = []  # question numbers in the order asked: responses come in that order
    requests: dict[str, int] = {}
    ask_every = max(1, round(ask_every_s * fps))

    async def read() -> None:
        while len(run.statuses) < len(run.asked) or not streamed.is_set():
            event = (await conn.receive()).event
            if isinstance(event, WatchFired) and event.frame_id is not None:
                run.fires.append(int(event.frame_id))
            elif isinstance(event, ResponseStart) and event.trigger is None and questions:
                requests[event.request_id] = questions.pop(0)
            elif isinstance(event, ResponseTextDelta) and event.request_id in requests:
                n = requests[event.request_id]
                run.answers[n] = run.answers.get(n, "") + event.delta
            elif isinstance(event, ResponseDone) and event.request_id in requests:
                run.statuses[requests[event.request_id]] = event.status

    streamed = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(read())
            start = time.perf_counter()
            for n, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, start + n / fps / speed - time.perf_counter()))
                await conn.send_frame(frame, frame_id=n, pts_ms=n * 1000 / fps)
                if n % ask_every == ask_every - 1:
                    number = len(run.asked)
                    run.asked[number] = colours[n]
                    questions.append(number)
                    await conn.query(QUESTION)
            streamed.set()
            try:
                await asyncio.wait_for(asyncio.shield(reader), SETTLE_S)
            except TimeoutError:
                reader.cancel()
    except* websockets.ConnectionClosed:
        pass
    finally:
        await conn.close()
    return run


def summary(run: DemoRun, seconds: float, fps: float, scene_s: float, ask_every_s: float) -> str:
    """The run as printed lines."""
    asked = len(run.asked)
    scenes = run.red_scenes()
    lines = [
        f"demo model at the server's defaults: {seconds:.0f} s at {fps:g} fps, the screen's colour changing "
        f"every {scene_s:g} s, '{QUESTION}' every {ask_every_s:g} s, a red alert watch",
        f"  answers right: {run.right} of {asked} ({run.right / max(1, asked):.1%})",
        f"  red scenes the watch fired in: {run.scenes_fired()} of {len(scenes)}; false fires: "
        f"{len(run.false_fires)} (frames {run.false_fires[:10]})",
    ]
    lines += [f"  wrong: {w}" for w in run.wrong()[:20]]
    return "\n".join(lines)


def run_demo(model: str | None, minutes: float, fps: float, scene_s: float, ask_every_s: float, speed: float) -> str:
    """Serve ``model`` (default: the demo model) with the defaults in its own process and stream
    the script into it; returns the summary."""
    from server.background import serve_process

    args = ["--log-level", "warning"] + (["--model", model] if model else [])
    seconds = minutes * 60
    with serve_process(args) as served:
        run = asyncio.run(stream_demo(served.ws_url, seconds, fps, scene_s, ask_every_s, speed))
    return summary(run, seconds, fps, scene_s, ask_every_s)
