"""What a session does with the microphone's audio, as part of its core (``SessionCore``
inherits it): buffering, turn detection's decisions and their events, the audio a question
being spoken will take, spoken questions held for the next answer. Pure, like the rest of the
core."""

from __future__ import annotations

from dataclasses import replace

from handlers.core.events import InputTranscribed, SpeechBegan, SpeechEnded
from handlers.core.items import PendingInput
from handlers.core.microphone import SpokenQuestion, audio_ms, decode_pcm
from handlers.core.turn_detection import RATE, SpeechStarted, TurnDetector, TurnEvent
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import SessionConfig


class Hearing:
    """The core's microphone half (its state lives on ``SessionCore``: ``mic``, ``voice``,
    ``config``, ``inputs``, ``items``, ``speech_item``, ``idle_at``)."""

    @property
    def detector(self) -> TurnDetector | None:
        """The turn detector, when server turn detection is on."""
        return self.mic.detector

    def _detector(self, config: SessionConfig) -> TurnDetector | None:
        turns = config.turn_detection
        if turns is None or self.voice.vad_window is None:
            return None
        return TurnDetector(turns.threshold, turns.silence_ms, self.voice.vad_window)

    def _padding(self) -> int:
        turns = self.config.turn_detection
        return 0 if turns is None else turns.prefix_padding_ms * RATE // 1000

    def add_audio(self, data: str) -> bytes:
        """Buffer a chunk of PCM16 audio; returns its samples. Raises ``invalid_audio``, or
        ``audio_overflow`` (without turn detection: with it, the oldest audio is dropped)."""
        pcm = decode_pcm(data)
        self.mic.add(pcm)
        return pcm

    def detect_turns(self, probabilities: list[float]) -> list[TurnEvent | SpokenQuestion]:
        """Judge the next voice-activity windows (turn detection must be on).

        Returns, in order, ``SpeechStarted`` for each start and, for each stop, the
        ``SpeechStopped`` followed by the ``SpokenQuestion`` to answer (its audio runs from
        ``prefix_padding_ms`` before the start to where the silence was complete), named by
        the speech's item id. While nobody speaks, only the padding's worth of audio is kept.
        """
        out = self.mic.heard(probabilities, self._padding())
        for n, event in enumerate(out):
            if isinstance(event, SpeechStarted):
                self.speech_item = f"item_speech_{self.session_id[:8]}_{next(self._speech_items)}"
                self.idle_at = None  # someone speaks: no answer for the silence
            elif isinstance(event, SpokenQuestion):
                out[n] = replace(event, item_id=self.speech_item or "")
        return out

    def listen_start(self) -> int | None:
        """Where the audio of the question being spoken now begins (a stream sample), or None
        when no question audio is building up: with turn detection, from the padding before the
        speech that has started; without it, the whole buffer (the next query takes it)."""
        if not (self.voice.transcribes and self.config.use_audio_in_video):
            return None
        return self.mic.question_start(self._padding())

    def turn_event(self, decision: TurnEvent) -> SpeechBegan | SpeechEnded:
        """The event that tells the client speech started or stopped (with the speech's item id)."""
        if isinstance(decision, SpeechStarted):
            return SpeechBegan(audio_start_ms=decision.start_ms, item_id=self.speech_item)
        previous = self.items.tail
        self.items.appended(self.speech_item)  # the spoken item joins the conversation now
        return SpeechEnded(
            audio_start_ms=decision.start_ms, audio_end_ms=decision.end_ms, item_id=self.speech_item,
            previous_item_id=previous,
        )

    @property
    def speech_interrupts(self) -> bool:
        """True when speech that starts interrupts the running answer (``interrupt_response``)."""
        turns = self.config.turn_detection
        return turns is None or turns.interrupt_response

    def answers_speech(self, answering: bool) -> bool:
        """True when a spoken question is answered at once (``create_response``); with an answer
        running, only when speech may interrupt it. Otherwise ``hold_spoken_question``."""
        turns = self.config.turn_detection
        return turns is None or (turns.create_response and (not answering or turns.interrupt_response))

    def hold_spoken_question(self, question: SpokenQuestion) -> PendingInput:
        """Keep a spoken question as an input of the next answer (a client's ``response.create``
        or the next question); returns it. Raises ``audio_overflow``."""
        if self._pending_audio_bytes() + len(question.pcm16) > self.limits.max_audio_bytes:
            raise SessionError(ErrorCode.AUDIO_OVERFLOW, f"pending audio would exceed {self.limits.max_audio_bytes} bytes")
        item = PendingInput(question.item_id, None, question.pcm16)
        self.inputs.append(item)
        return item

    def transcribed_input(self, item_id: str, transcript: str) -> InputTranscribed | None:
        """A held spoken input's words replace its audio; returns the event to send, or None
        when the input is gone (deleted, or taken by an answer meanwhile)."""
        item = next((i for i in self.inputs if i.item_id == item_id and i.pcm16), None)
        if item is None:
            return None
        length_ms = audio_ms(item.pcm16)
        item.text, item.pcm16, item.spoken = transcript.strip() or None, b"", True
        if item.text is None:
            self.inputs.remove(item)
        return InputTranscribed(item_id=item_id, transcript=transcript, audio_ms=length_ms)

    @staticmethod
    def audio_ms(pcm16: bytes) -> float:
        """How long 16 kHz PCM16 audio is, in ms."""
        return audio_ms(pcm16)

    def pcm(self, data: str) -> bytes:
        """Base64 PCM16 as bytes. Raises ``invalid_audio``."""
        return decode_pcm(data)
