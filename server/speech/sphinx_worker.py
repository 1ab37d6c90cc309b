"""A recogniser process: one PocketSphinx decoder behind a pipe (``pocketsphinx_asr`` runs a
pool of them, so recognition never holds the server's GIL).

Run as a script (``python -P sphinx_worker.py``): it imports nothing of the server, only
the standard library, NumPy and PocketSphinx. Commands come on stdin, replies go on the
original stdout (fd 1 is pointed at stderr at once, so nothing a library prints can break
the protocol). Every frame is a 4-byte big-endian payload length, a 1-byte kind, the payload.

Commands (each answered by exactly one reply, except ``ABORT``):

- ``CALIBRATE`` (16 kHz PCM16, may be empty): load the model, recognise the audio once and
  keep the feature normalisation (CMN) it leaves; first command, answered when ready.
- ``BEGIN``: end an utterance left open (abandoned by a cancelled caller), start a new one
  from the calibrated CMN and a fresh noise estimate, so no utterance inherits another's
  (another session's) noise.
- ``AUDIO`` (PCM16): recognise it, in steps of ``STEP_SAMPLES``.
- ``END``: end the utterance; the reply's payload is the hypothesis (UTF-8, may be empty).
- ``ABORT``: the caller of the running command was cancelled: stop recognising its audio
  (checked between steps) and answer it with ``ABORTED``. Ignored when nothing runs.

Replies: ``OK`` (payload as above), ``ABORTED``, ``FAILED`` (payload: the error, UTF-8).
The process exits when stdin closes (the server stopped or died), so none outlives it.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import sys
import warnings

HEADER = struct.Struct(">IB")
CALIBRATE, BEGIN, AUDIO, END, ABORT = b"C", b"B", b"A", b"E", b"X"
OK, ABORTED, FAILED = b"K", b"Q", b"F"

#: Standard deviation of the added noise floor, in PCM16 steps (about -61 dBFS):
#: PocketSphinx's feature normalisation fails on digital silence (synthesized or gated audio).
NOISE_FLOOR = 30.0
#: Samples recognised between two checks for ``ABORT`` (100 ms at 16 kHz).
STEP_SAMPLES = 1600


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One protocol frame."""
    return HEADER.pack(len(payload), kind[0]) + payload


def parse(buffer: bytearray) -> tuple[bytes, bytes] | None:
    """Take one whole frame (kind, payload) off the front of ``buffer``; None if none is whole."""
    if len(buffer) < HEADER.size:
        return None
    size, kind = HEADER.unpack_from(buffer)
    end = HEADER.size + size
    if len(buffer) < end:
        return None
    payload = bytes(buffer[HEADER.size : end])
    del buffer[:end]
    return bytes([kind]), payload


class _Pipe:
    """Frames in on fd 0, out on ``out``."""

    def __init__(self, out: int) -> None:
        self._out = out
        self._buffer = bytearray()

    def read(self) -> tuple[bytes, bytes] | None:
        """The next command, waiting for it; None when stdin is closed."""
        while (got := parse(self._buffer)) is None:
            chunk = os.read(0, 1 << 20)
            if not chunk:
                return None
            self._buffer.extend(chunk)
        return got

    def pending(self) -> bool:
        """True when a command arrived (without waiting)."""
        return bool(self._buffer) or bool(select.select([0], [], [], 0)[0])

    def write(self, kind: bytes, payload: bytes = b"") -> None:
        view = memoryview(frame(kind, payload))
        while view:
            view = view[os.write(self._out, view) :]


class _Recogniser:
    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._decoder = None
        self._cmn = ""
        self._in_utterance = False
        self._rng = None

    def calibrate(self, pcm16: bytes) -> None:
        from pocketsphinx import Decoder

        self._decoder = Decoder(loglevel="FATAL", fwdflat=False, bestpath=False)
        if pcm16:
            self.begin()
            self._decoder.process_raw(self._floored(pcm16), full_utt=True)
            self._decoder.end_utt()
            self._in_utterance = False
        self._cmn = self._decoder.get_cmn(False)

    def begin(self) -> None:
        import numpy as np

        if self._in_utterance:
            self._decoder.end_utt()
        with warnings.catch_warnings():
            # Deprecated in the bindings as "unnecessary", but it is what resets the noise
            # removal's estimate, which otherwise carries from one utterance into the next.
            warnings.simplefilter("ignore", DeprecationWarning)
            self._decoder.start_stream()
        if self._cmn:
            self._decoder.set_cmn(self._cmn)
        self._rng = np.random.default_rng(0)
        self._decoder.start_utt()
        self._in_utterance = True

    def audio(self, pcm16: bytes) -> bool:
        """Recognise ``pcm16``; False when an ``ABORT`` stopped it."""
        step = STEP_SAMPLES * 2
        for at in range(0, len(pcm16), step):
            if self._pipe.pending():
                return False
            self._decoder.process_raw(self._floored(pcm16[at : at + step]), full_utt=False)
        return True

    def end(self) -> str:
        self._decoder.end_utt()
        self._in_utterance = False
        hyp = self._decoder.hyp()
        return "" if hyp is None else hyp.hypstr

    def _floored(self, pcm16: bytes) -> bytes:
        import numpy as np

        if self._rng is None:
            self._rng = np.random.default_rng(0)
        samples = np.frombuffer(pcm16, "<i2").astype(np.float32)
        samples += self._rng.normal(0.0, NOISE_FLOOR, len(samples)).astype(np.float32)
        return np.clip(samples, -32768, 32767).astype("<i2").tobytes()


def serve(pipe: _Pipe) -> None:
    """Answer commands until stdin closes."""
    recogniser = _Recogniser(pipe)
    while (command := pipe.read()) is not None:
        kind, payload = command
        if kind == ABORT:
            continue  # its command had finished before the abort came
        try:
            if kind == CALIBRATE:
                recogniser.calibrate(payload)
                pipe.write(OK)
            elif kind == BEGIN:
                recogniser.begin()
                pipe.write(OK)
            elif kind == AUDIO:
                if recogniser.audio(payload):
                    pipe.write(OK)
                else:
                    pipe.read()  # the ABORT that stopped it
                    pipe.write(ABORTED)
            elif kind == END:
                pipe.write(OK, recogniser.end().encode())
            else:
                pipe.write(FAILED, f"unknown command {kind!r}".encode())
        except Exception as exc:  # noqa: BLE001 - every failure is answered; the server decides
            pipe.write(FAILED, f"{type(exc).__name__}: {exc}".encode())


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle
    out = os.dup(1)
    os.dup2(2, 1)  # stray prints go to the log, not into the protocol
    try:
        serve(_Pipe(out))
    except BrokenPipeError:
        pass  # the server is gone


if __name__ == "__main__":
    main()
    sys.exit(0)
