"""Cutting a codec's start-up artefact from an engine's own audio, once per answer (pure)."""

from __future__ import annotations

import logging

from server.speech.wav import trim_leading

log = logging.getLogger("livesight.speech")


class NativeAudioTrim:
    """Cuts the first ``ms`` milliseconds of one answer's engine audio (across chunks if the
    first is shorter). Everything after passes through byte for byte."""

    def __init__(self, ms: float) -> None:
        self._left = ms

    def apply(self, wav: bytes) -> bytes:
        """The chunk to send (empty when all of it was cut). A chunk that is not PCM16 WAV
        passes unchanged (and ends the trimming)."""
        if self._left <= 0:
            return wav
        try:
            trimmed, self._left = trim_leading(wav, self._left)
        except ValueError as exc:
            log.warning("engine audio is not PCM16 WAV (%s); passed on untrimmed", exc)
            self._left = 0
            return wav
        return trimmed
