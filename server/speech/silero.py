"""Voice activity: Silero VAD, the ONNX model inside the ``silero-vad`` wheel, run with
onnxruntime (no torch). One inference session serves every stream; each stream carries its
own recurrent state and the last 64 samples of context, as the model expects.
"""

from __future__ import annotations

import importlib.util
import os

import anyio
import numpy as np

from server import blocking
from server.speech.base import SpeechError, VadStream, VoiceActivityModel

WINDOW = 512  # samples at 16 kHz: 32 ms
CONTEXT = 64


def model_path() -> str:
    """The wheel's ``silero_vad.onnx``, found without importing the package (which imports torch).

    Raises ``SpeechError`` when the package is not installed.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise SpeechError("the silero-vad package is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
    if not os.path.isfile(path):
        raise SpeechError("the silero-vad package has no ONNX model")
    return path


class SileroStream(VadStream):
    def __init__(self, session: object) -> None:
        self._session = session
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._rate = np.array(16000, np.int64)

    def process(self, pcm16: bytes) -> list[float]:
        # State moves only after a whole call: a cancelled call leaves the stream as it was.
        samples = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
        pending = np.concatenate([self._pending, samples])
        state, context = self._state, self._context
        probs = []
        start = 0
        while start + WINDOW <= len(pending):
            blocking.cancel_point()  # a long chunk is judged window by window: a cancel waits one
            window = np.concatenate([context, pending[start : start + WINDOW]])[None, :]
            out, state = self._session.run(None, {"input": window, "state": state, "sr": self._rate})
            context = window[0, -CONTEXT:]
            probs.append(float(out[0, 0]))
            start += WINDOW
        self._state, self._context = state, context
        self._pending = pending[start:].copy()
        return probs


class SileroVad(VoiceActivityModel):
    """Silero VAD v5+ (16 kHz, 32 ms windows)."""

    name = "silero"
    window_samples = WINDOW

    def __init__(self, threads: int = 2) -> None:
        self._threads = threads
        self._session: object | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    async def start(self) -> None:
        self._limiter = anyio.CapacityLimiter(self._threads)
        self._session = await blocking.run_blocking(_load, model_path(), limiter=self._limiter)

    def open_stream(self) -> VadStream:
        if self._session is None:
            raise SpeechError("the voice activity model is not started")
        return SileroStream(self._session)

    async def probabilities(self, stream: VadStream, pcm16: bytes) -> list[float]:
        return await blocking.run_blocking(stream.process, pcm16, limiter=self._limiter)


def _load(path: str) -> object:
    try:
        import onnxruntime
    except ImportError as exc:
        raise SpeechError("the onnxruntime package is not installed") from exc
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    except (RuntimeError, ValueError) as exc:  # onnxruntime's own errors derive from RuntimeError
        raise SpeechError(f"the Silero VAD model could not be loaded: {exc}") from exc
