"""``livesight bench cameras``: N RTSP cameras pulled by the server, each watched for a red
screen, alerts delivered to a webhook.

One GStreamer RTSP server (Debian's, ``rtsp_camera.py``) serves N mounts of one H.264 clip
(25 fps, the colours model's screen: grey, with red scenes at known times); ``livesight serve``
on the shipped colours model pulls each as a stream sampled at 2 fps, with the alert watch
"Is the screen red?", delivering to a webhook receiver in this process. The streams start a
quarter of a second apart (their clips play from their own connect). Prints the server's CPU
per stream (decoding included) against the same server idle, the decision latency from a red
scene's first frame in the source to its fire at the webhook (p50/p99), fires against red
scenes (missed, false), webhook deliveries lost, and the server's memory.

A red scene's first frame is placed on the wall clock from the fire itself: the fired frame
was sampled at ``frame_at_ms`` and lies ``frame_pts_ms - red_start`` into the scene, so the
scene began that much earlier (the RTSP server plays each clip in real time from the connect).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from server.background import serve_process
from server.bench.camera_servers import RtspCamera, WebhookReceiver
from server.bench.footage import write_colour_clip
from server.bench.latency import percentile
from server.bench.process import process_cpu_s, rss_bytes

FPS = 25
SAMPLED_FPS = 2
SECRET = "bench-cameras-secret"
WATCH = {"watch_id": "red", "condition": "Is the screen red?", "cooldown_s": 0}
#: The clip: grey, and a red scene of RED_S seconds every PERIOD_S seconds from FIRST_RED_S.
FIRST_RED_S, PERIOD_S, RED_S = 6.2, 12.3, 4.0


def scenes(seconds: float) -> list[tuple[str, float]]:
    out, t = [("grey", FIRST_RED_S)], FIRST_RED_S
    while t < seconds:
        out += [("red", RED_S), ("grey", PERIOD_S - RED_S)]
        t += PERIOD_S
    return out


def red_starts_ms(seconds: float) -> list[float]:
    """The red scenes' first frames, ms into the clip, of those that end before ``seconds``."""
    starts, t = [], FIRST_RED_S
    while t + RED_S <= seconds:
        starts.append(t * 1000)
        t += PERIOD_S
    return starts


@dataclass
class Figures:
    streams: int
    seconds: float
    cpu_s: float = 0.0
    idle_cpu_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    scenes: int = 0
    missed: int = 0
    false: int = 0
    lost: int = 0
    rss_before: int = 0
    rss_after: int = 0
    sampled: int = 0
    decoded: int = 0
    shed: int = 0
    unplaced: int = 0  # fires without their frame (decided too late to keep it)

    def lines(self) -> list[str]:
        per_stream_ms = (self.cpu_s - self.idle_cpu_s) / max(self.streams * self.seconds, 1e-9) * 1000
        lat = self.latencies_ms
        return [
            f"server CPU per stream: {per_stream_ms:.1f} ms a second ({per_stream_ms / 10:.1f}% of a core; decode, "
            f"sampling, checks and delivery; the server idle for as long: {self.idle_cpu_s / self.seconds * 1000:.1f} "
            f"ms a second in all, taken off); frames decoded {self.decoded}, sampled {self.sampled}, shed {self.shed}",
            f"decision latency, a red scene's first frame in the source to its fire at the webhook: "
            + (f"p50 {percentile(lat, 0.5):.0f} ms, p99 {percentile(lat, 0.99):.0f} ms, max {max(lat):.0f} ms "
               f"over {len(lat)} fires" if lat else "no fires"),
            f"fires: {len(lat)} of {self.scenes} red scenes, missed {self.missed}, false {self.false}; "
            f"webhook deliveries lost {self.lost}; fires without their frame {self.unplaced}",
            f"server RSS {self.rss_before / 2**20:.0f} MiB before the streams, {self.rss_after / 2**20:.0f} MiB at the end "
            f"(+{(self.rss_after - self.rss_before) / 2**20 / max(self.streams, 1):.1f} MiB a stream)",
        ]


def run_cameras(streams: int, seconds: float, size: tuple[int, int], max_frames: int | None = None) -> Figures:
    from server.models.demo import shipped_model_dir

    figures = Figures(streams, seconds)
    with tempfile.TemporaryDirectory(prefix="livesight-bench-cameras-") as tmp:
        folder = Path(tmp)
        clip = folder / "camera.mp4"
        write_colour_clip(clip, scenes(seconds + 5), fps=FPS, size=size)
        receiver = WebhookReceiver(SECRET)
        camera = RtspCamera({f"cam{n}": clip for n in range(streams)})
        camera.start()
        args = ["--log-level", "warning", "--model", str(shipped_model_dir()), "--data-dir", str(folder / "data"),
                "--max-streams", str(streams), "--max-sessions", str(max(64, streams * 2)), "--resume-grace-s", "0"]
        try:
            with serve_process(args, log_path=folder / "serve.log") as served, \
                    httpx.Client(base_url=served.http_url, timeout=30) as http:
                pid = served.proc.pid
                figures.rss_before = rss_bytes(pid)
                idle = process_cpu_s(pid)
                time.sleep(min(5.0, seconds / 4))
                figures.idle_cpu_s = (process_cpu_s(pid) - idle) / min(5.0, seconds / 4) * seconds
                began = process_cpu_s(pid)
                ids = []
                for n in range(streams):
                    created = http.post("/v1/streams", json={
                        "source": camera.url(f"cam{n}"), "name": f"cam{n}", "fps": SAMPLED_FPS, "lookback_s": 1,
                        "config": {"sampling": {"max_tokens": 4},
                                   **({"max_frames": max_frames} if max_frames else {})}, "watches": [WATCH],
                        "deliver": {"webhook": {"url": receiver.url, "secret": SECRET}}})
                    created.raise_for_status()
                    ids.append(created.json()["stream_id"])
                    time.sleep(0.25)
                time.sleep(seconds)
                figures.cpu_s = process_cpu_s(pid) - began
                statuses = [http.get(f"/v1/streams/{i}").json() for i in ids]
                figures.rss_after = rss_bytes(pid)
                time.sleep(3.0)  # the last fires' deliveries
                score(figures, receiver, statuses, seconds)
        finally:
            camera.stop()
            receiver.close()
    return figures


def score(figures: Figures, receiver: WebhookReceiver, statuses: list[dict], seconds: float) -> None:
    """Fires against the script: each red scene's first fire and its latency; fires outside red."""
    figures.sampled = sum(s["frames_sampled"] for s in statuses)
    figures.decoded = sum(s["frames_decoded"] for s in statuses)
    figures.shed = sum(s["frames_shed"] for s in statuses)
    starts = red_starts_ms(seconds)
    every = red_starts_ms(seconds + PERIOD_S)  # a scene still running at the end may fire too: not a false fire
    fires = [r for r in receiver.accepted().values() if r["body"]["type"] == "watch.fired"]
    sent = sum(s["fires"] for s in statuses)
    figures.lost = max(0, sent - len(fires))
    by_stream: dict[str, list[dict]] = {}
    for fire in fires:
        by_stream.setdefault(fire["body"]["stream_id"], []).append(fire)
    for status in statuses:
        mine = sorted(by_stream.get(status["stream_id"], []), key=lambda f: f["body"]["frame_pts_ms"] or 0)
        used: set[int] = set()
        for start in starts:
            hit = next((n for n, f in enumerate(mine) if n not in used
                        and start <= (f["body"]["frame_pts_ms"] or -1) < start + RED_S * 1000), None)
            if hit is None:
                figures.missed += 1
                continue
            used.add(hit)
            body = mine[hit]["body"]
            if body["frame_at_ms"] is None:  # decided after its frame left the stream's ring: no evidence
                figures.unplaced += 1
                continue
            began_ms = body["frame_at_ms"] - (body["frame_pts_ms"] - start)
            figures.latencies_ms.append(mine[hit]["at"] * 1000 - began_ms)
        figures.false += sum(1 for n, f in enumerate(mine) if n not in used and not any(
            s <= (f["body"]["frame_pts_ms"] or -1) < s + RED_S * 1000 for s in every))
    figures.scenes = len(starts) * len(statuses)


def bench_cameras(streams: int, seconds: float, size: tuple[int, int], max_frames: int | None = None) -> None:
    print(f"bench cameras: {streams} RTSP cameras ({size[0]}x{size[1]} H.264 at {FPS} fps, one GStreamer RTSP server) "
          f"pulled by the server at {SAMPLED_FPS} fps each for {seconds:g} s, each with the alert watch "
          f"'{WATCH['condition']}' (a red scene of {RED_S:g} s every {PERIOD_S:g} s from {FIRST_RED_S:g} s), "
          f"delivered to a webhook; the shipped colours model; each stream's window "
          f"{max_frames or 'the server default'} frames", flush=True)
    for line in run_cameras(streams, seconds, size, max_frames).lines():
        print(line)
