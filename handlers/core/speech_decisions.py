"""The core's decisions about the microphone (``SessionMachine`` inherits them): audio
buffered and judged for speech, speech that starts (barge-in) and stops (a question asked,
or held for the next answer and transcribed), and the audio a question being spoken will
take, streamed into a transcription as it arrives. Pure."""

from __future__ import annotations

from handlers.core.effects import (
    DetectSpeech,
    Effect,
    HeldTranscribed,
    ListenFeed,
    ListenStart,
    Now,
    Refused,
    Send,
    SpeechDetected,
    StopListening,
    TranscribeHeld,
    error_event,
)
from handlers.core.microphone import SpokenQuestion
from handlers.core.turn_detection import SpeechStarted, SpeechStopped
from handlers.wire.errors import SessionError
from handlers.wire.protocol import AudioChunkIn, origin_of


class SpeechDecisions:
    """The machine's microphone half (its state: ``state``, ``source``, ``_listening``,
    ``_listened``; the rest of its decisions: ``_stop_answer``, ``_wait_or``, ``_plan``,
    ``_ask``, ``_guarded``)."""

    def _audio(self, event: AudioChunkIn) -> list[Effect]:
        """Buffer microphone audio; with turn detection, judge it. Audio a question will take
        is transcribed as it arrives (``_listen``)."""
        try:
            pcm = self.state.add_audio(event.data)
        except SessionError as exc:
            return self._listen() + [Send(error_event(exc, origin_of(event)))]
        detect: list[Effect] = [DetectSpeech(pcm)] if self._vad else []
        return self._listen() + detect

    def _speech(self, result: SpeechDetected, now: Now) -> list[Effect]:
        """Speech starting interrupts the running answer (barge-in), unless turn detection
        says not to; speech stopping asks a question, or holds it for the next answer."""
        effects: list[Effect] = []
        for decision in self.state.detect_turns(result.probabilities):
            if isinstance(decision, SpeechStarted):
                effects.append(Send(self.state.turn_event(decision)))
                if self.state.speech_interrupts:
                    effects += self._stop_answer("speech")
            elif isinstance(decision, SpeechStopped):
                effects.append(Send(self.state.turn_event(decision)))
            elif isinstance(decision, SpokenQuestion):
                effects += self._guarded(None, lambda q=decision: self._spoken_question(q, now))  # type: ignore[misc]
        return effects + self._listen()

    def _spoken_question(self, question: SpokenQuestion, now: Now) -> list[Effect]:
        """Speech stopped: its question is answered now (the running answer stopped first:
        its transcription then starts afresh), or held for the next answer."""
        if not self.state.answers_speech(self.state.running is not None):
            return self._hold(question)
        if self.state.running is not None:
            stop = [StopListening()] if self._take_listening() else []
            return stop + self._wait_or(None, now, lambda later: self._spoken_question(question, later))
        take = self._take_listening()
        answer = self._plan(lambda: self.state.plan_spoken_query(question), take)
        return self._ask(answer, now.s, now, take_listening=take)

    def _hold(self, question: SpokenQuestion) -> list[Effect]:
        """A spoken question that starts no answer waits as an input of the next one; when the
        engine cannot hear, its words are recognised now."""
        take = self._take_listening()
        stop: list[Effect] = [StopListening()] if take else []
        try:
            item = self.state.hold_spoken_question(question)
        except SessionError as exc:
            raise Refused(exc, stop) from None
        if not (self.state.voice.transcribes and self.config.use_audio_in_video):
            return stop  # the engine hears it with the answer (or it is not used)
        return [TranscribeHeld(item.item_id, item.pcm16, take_listening=take)]

    def _held(self, result: HeldTranscribed, now: Now) -> list[Effect]:
        event = self.state.transcribed_input(result.item_id, result.transcript)
        return [Send(event)] if event is not None else []

    def _listen(self) -> list[Effect]:
        """Hand the audio a question will take to a running transcription (started when such
        audio begins; stopped when it was dropped or the question went elsewhere)."""
        start = self.state.listen_start()
        effects: list[Effect] = []
        if self._listening is not None and self._listening != start:
            self._listening = None
            effects.append(StopListening())
        if start is None:
            return effects
        if self.state.detector is None and self.source.commits_audio:
            return effects  # the buffer waits for a commit; a streamed transcription would be cut there
        mic = self.state.mic
        if self._listening is None:
            self._listening = self._listened = start
            effects.append(ListenStart(start))
        effects.append(ListenFeed(mic.since(self._listened), mic.total))
        self._listened = mic.total
        return effects
