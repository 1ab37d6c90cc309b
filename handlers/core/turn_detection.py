"""Server turn detection: when a speaker starts and stops, from voice activity probabilities.

Pure: ``TurnDetector`` is fed one speech probability per fixed window of the session's
microphone stream (sample 0 = the first microphone sample of the session) and returns
``SpeechStarted`` / ``SpeechStopped`` decisions. Speech starts at the first window at or
above ``threshold``; it goes on while windows stay at or above a lower threshold (hysteresis,
as Silero's own iterator does) and stops once ``silence_ms`` of windows below it have passed.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE = 16_000
HYSTERESIS = 0.15


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    start_sample: int

    @property
    def start_ms(self) -> float:
        return self.start_sample * 1000 / RATE


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    start_sample: int
    end_sample: int  # end of the last window that was speech
    detected_sample: int  # where the silence that ended it was complete

    @property
    def start_ms(self) -> float:
        return self.start_sample * 1000 / RATE

    @property
    def end_ms(self) -> float:
        return self.end_sample * 1000 / RATE


TurnEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    """Speech start/stop over a stream of per-window probabilities."""

    def __init__(self, threshold: float, silence_ms: float, window_samples: int) -> None:
        self.threshold = threshold
        self.keep_threshold = max(0.01, threshold - HYSTERESIS)
        self.silence_samples = int(silence_ms * RATE / 1000)
        self.window = window_samples
        self.windows = 0
        self.speech_start: int | None = None
        self._speech_end = 0

    @property
    def speaking(self) -> bool:
        return self.speech_start is not None

    @property
    def position(self) -> int:
        """Samples of the stream judged so far."""
        return self.windows * self.window

    def feed(self, probabilities: list[float]) -> list[TurnEvent]:
        """Judge the next windows; returns the starts and stops they contain, in order."""
        events: list[TurnEvent] = []
        for p in probabilities:
            start = self.windows * self.window
            end = start + self.window
            self.windows += 1
            if self.speech_start is None:
                if p >= self.threshold:
                    self.speech_start, self._speech_end = start, end
                    events.append(SpeechStarted(start))
            elif p >= self.keep_threshold:
                self._speech_end = end
            elif end - self._speech_end >= self.silence_samples:
                events.append(SpeechStopped(self.speech_start, self._speech_end, end))
                self.speech_start = None
        return events
