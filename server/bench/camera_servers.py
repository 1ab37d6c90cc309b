"""What the stream tests and ``bench cameras`` run against, each a real server on 127.0.0.1:
an RTSP camera (Debian's GStreamer RTSP server, ``rtsp_camera.py``), an HTTP MJPEG camera,
HLS written by FFmpeg (PyAV's muxer) and served over HTTP, Debian's Mosquitto, and a webhook
receiver. Each leaves nothing behind."""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from server.streams.delivery import verify

SYSTEM_PYTHON = Path("/usr/bin/python3")
RTSP_SCRIPT = Path(__file__).resolve().parent / "rtsp_camera.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RtspCamera:
    """``rtsp://127.0.0.1:PORT/NAME`` for each clip; ``stop`` and ``start`` again on the same
    port (a camera that drops and returns). Fails (never skips) without GStreamer."""

    def __init__(self, clips: dict[str, Path], port: int = 0) -> None:
        self.clips = clips
        self.port = port  # 0: the camera's first start takes a free one, and keeps it
        self.proc: subprocess.Popen[str] | None = None

    def url(self, name: str) -> str:
        assert self.port, "start the camera first"
        return f"rtsp://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        assert SYSTEM_PYTHON.exists(), "the system Python is missing (Debian's python3)"
        # -I: the script's folder (tests/, whose socket/ would hide the standard socket) is not on the path
        args = [str(SYSTEM_PYTHON), "-I", str(RTSP_SCRIPT), str(self.port), *(f"{n}={p}" for n, p in self.clips.items())]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            self.stop()
            raise AssertionError(f"the RTSP camera did not start (make setup installs GStreamer): {line!r}")
        self.port = int(line[1])
        deadline = time.monotonic() + 10
        while True:  # listening, not only bound
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"the RTSP camera on port {self.port} does not answer") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            self.proc = None

    def __enter__(self) -> RtspCamera:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def mjpeg_camera(jpegs: list[bytes], fps: float) -> Iterator[str]:
    """An HTTP MJPEG camera (``multipart/x-mixed-replace``) looping ``jpegs`` at ``fps``; yields its URL."""
    stop = threading.Event()

    class Handler(_Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            n = 0
            try:
                while not stop.is_set():
                    jpeg = jpegs[n % len(jpegs)]
                    self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n"
                                     + f"Content-Length: {len(jpeg)}\r\n\r\n".encode() + jpeg + b"\r\n")
                    self.wfile.flush()
                    n += 1
                    time.sleep(1 / fps)
            except (BrokenPipeError, ConnectionResetError):
                pass

    with _serving(Handler) as base:
        try:
            yield f"{base}/camera.mjpg"
        finally:
            stop.set()


@contextmanager
def hls_camera(clip: Path, folder: Path) -> Iterator[str]:
    """``clip`` cut into an HLS playlist by FFmpeg (PyAV's hls muxer, no encoding) and served
    over HTTP; yields the playlist's URL."""
    import av

    folder.mkdir(parents=True, exist_ok=True)
    with av.open(str(clip)) as src, av.open(str(folder / "index.m3u8"), "w", format="hls",
                                           options={"hls_time": "1", "hls_list_size": "0"}) as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is None:
                continue
            packet.stream = stream
            out.mux(packet)
    handler = functools.partial(type("Files", (SimpleHTTPRequestHandler, _Quiet), {}), directory=str(folder))
    with _serving(handler) as base:
        yield f"{base}/index.m3u8"


@contextmanager
def _serving(handler: Any) -> Iterator[str]:
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    http.daemon_threads = True
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()


MOSQUITTO = Path("/usr/sbin/mosquitto")


@contextmanager
def mosquitto() -> Iterator[str]:
    """Debian's Mosquitto on a free port of 127.0.0.1 (anonymous, in memory); yields its
    ``mqtt://`` URL. Fails (never skips) without it."""
    assert MOSQUITTO.exists(), "Mosquitto is missing: make setup installs it (apt-get install mosquitto)"
    port = free_port()
    proc = subprocess.Popen([str(MOSQUITTO), "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "Mosquitto did not start"
                time.sleep(0.05)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.communicate(timeout=10)


class WebhookReceiver:
    """A webhook receiver: answers 500 to its first ``failures`` requests, then 200; keeps
    every request (arrival ``time.time()``, event id, whether its signature checks out with
    ``secret``, body, status). ``port`` 0: a free one."""

    def __init__(self, secret: str, failures: int = 0, port: int = 0) -> None:
        receiver = self
        self.failures = failures
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

        class Handler(_Quiet):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    failing = receiver.failures > 0
                    receiver.failures -= failing
                    receiver.requests.append({
                        "at": time.time(), "event_id": self.headers.get("livesight-event-id"),
                        "signed": verify(secret, self.headers.get("livesight-signature", ""), body),
                        "body": json.loads(body), "status": 500 if failing else 200})
                self.send_response(500 if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hook"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def accepted(self) -> dict[str, dict[str, Any]]:
        """The events taken (200), by event id."""
        with self.lock:
            return {r["event_id"]: r for r in self.requests if r["status"] == 200}

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
