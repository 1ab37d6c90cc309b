"""How a session's core plans an answer (``SessionCore`` inherits it): the frames a question
may use, and an ``Answer`` for a typed or spoken question, a client's request, a silence that
timed out, or a watch that fired, with its frames pinned until it ends. Pure."""

from __future__ import annotations

from dataclasses import replace

from handlers.core.answer import Answer
from handlers.core.events import IdleTimeout, WatchTrigger
from handlers.core.frames import Frame
from handlers.core.items import PendingInput
from handlers.core.microphone import SpokenQuestion, decode_pcm
from handlers.core.turn_detection import RATE
from handlers.core.watches import WATCH_ANSWER_TOKENS, Fire
from handlers.wire.commands import AnswerRequest, InputMessage
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.protocol import VideoQuery
from server.engines.base import AudioSegment, Sampling


def _spoken(inputs: list[PendingInput]) -> str:
    """The words of ``inputs`` that were transcribed speech."""
    return "\n".join(i.text for i in inputs if i.spoken and i.text)


class Planning:
    """The core's answer planning (its state lives on ``SessionCore``)."""

    def candidate_frames(self) -> list[Frame]:
        """The frames a query may use now (some may still be decoding): the timeline's, then
        the buffered frames that arrived after the last one it considered."""
        held = self.timeline.frames
        newer = [f for f in self.buffer.frames if not held or f.seq > held[-1].seq]
        return [f for f in held if f.in_window] + newer

    def plan_query(self, event: VideoQuery) -> Answer:
        """Start an answer: pins its frames and takes the buffered audio (with turn detection
        on, the buffer belongs to the detector: only ``audio_data`` is taken).

        Raises ``no_frames`` when nothing is buffered, ``invalid_audio`` for bad audio.
        """
        extra = decode_pcm(event.audio_data) if event.audio_data else b""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send video.frame first")
        pcm = extra
        if self.detector is None:
            pcm = self.mic.take() + extra
        # spoken turns held by turn detection (create_response off) come first; v1 has no other inputs
        held = [i.text for i in self.inputs if i.text]
        pcm = b"".join(i.pcm16 for i in self.inputs) + pcm
        question = "\n".join([*held, event.text]) if held else event.text
        spoken = _spoken(self.inputs)
        input_ids = [i.item_id for i in self.inputs]
        self.inputs.clear()
        audio = AudioSegment(f"audio-{len(pcm)}", pcm) if pcm and self.config.use_audio_in_video else None
        answer = self._plan(frames, question, audio)
        answer.spoken, answer.input_ids = spoken, input_ids
        return answer

    def plan_spoken_query(self, question: SpokenQuestion) -> Answer:
        """Start an answer to a question turn detection found. Raises ``no_frames``."""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the spoken question; send video.frame first")
        answer = self._plan(frames, "", AudioSegment(f"audio-{len(question.pcm16)}", question.pcm16))
        answer.input_ids = [question.item_id] if question.item_id else []
        return answer

    def plan_idle(self) -> tuple[Answer, IdleTimeout]:
        """The answer a silence starts (no question: the conversation so far prompts it), and
        the event that says why. Raises ``no_frames``."""
        self.idle_at = None
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the idle timeout's answer")
        item_id = f"item_idle_{self.session_id[:8]}_{next(self._speech_items)}"
        event = IdleTimeout(item_id=item_id, audio_start_ms=self._idle_since * 1000 / RATE,
                            audio_end_ms=self.mic.total * 1000 / RATE)
        answer = self._plan(frames, "", None)
        answer.after_silence = True
        return answer, event

    def _plan(
        self, frames: list[Frame], question: str, audio: AudioSegment | None, request: AnswerRequest | None = None
    ) -> Answer:
        self.idle_at = None  # an answer is asked: the silence it waited for is over
        self.buffer.pin(frames)
        sampling = self.config.sampling
        max_tokens = sampling.max_tokens
        modalities = list(self.config.modalities)
        if request is not None and request.max_tokens is not None:
            max_tokens = min(request.max_tokens, self.limits.max_answer_tokens)
        if request is not None and request.modalities is not None:
            wanted = [m for m in request.modalities if m == "text" or self.voice.output is not None]
            modalities = list(dict.fromkeys(["text", *wanted]))
        number = next(self._requests)
        return Answer(
            request_id=f"resp_{self.session_id[:8]}_{number}",
            item_id=f"item_answer_{self.session_id[:8]}_{number}",
            question=question,
            frames=frames,
            audio=audio,
            sampling=Sampling(sampling.temperature, sampling.top_p, max_tokens, sampling.seed),
            modalities=modalities,
            instructions=request.instructions if request is not None else None,
        )

    def refuse_cancel(self, asked: bool) -> SessionError | None:
        """A cancel of the running answer (``response.cancel`` on ``/v1/realtime``): the error
        it gets when nothing is running and none is ``asked`` (read, not yet planned), else None."""
        if self.running is None and not asked:
            return SessionError(ErrorCode.RESPONSE_CANCEL_NOT_ACTIVE, "there is no response in progress to cancel")
        return None

    @staticmethod
    def configured_again() -> SessionError:
        """What a second ``session.config`` gets (the session goes on as it was)."""
        return SessionError(ErrorCode.INVALID_MESSAGE, "the session is already configured")

    def check_request(self, request: AnswerRequest, answering: bool) -> None:
        """Raises ``conversation_already_has_active_response`` for an exclusive request while
        an answer is asked or running (OpenAI Realtime runs one response at a time)."""
        if request.exclusive and answering:
            raise SessionError(
                ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE,
                "a response is in progress; wait for its response.done (or cancel it) before creating another",
            )

    def plan_answer(self, request: AnswerRequest) -> Answer:
        """Start an answer over the pending inputs (their text is the question, their audio
        the spoken part); the inputs are used up unless the answer stays out of the
        conversation. With ``input``, the answer's context is only that: its messages, and
        the frames it names (else the buffered ones). Raises ``no_frames`` (inputs are kept)
        and ``item_not_found`` (an input naming no item)."""
        if request.input is not None:
            return self._plan_own_context(request)
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send an image first")
        question = "\n".join(i.text for i in self.inputs if i.text)
        pcm = b"".join(i.pcm16 for i in self.inputs)
        spoken = _spoken(self.inputs)
        input_ids = [i.item_id for i in self.inputs]
        if request.in_conversation:
            self.inputs.clear()
        audio = AudioSegment(f"audio-{len(pcm)}", pcm) if pcm and self.config.use_audio_in_video else None
        answer = self._plan(frames, question, audio, request)
        answer.spoken, answer.input_ids = spoken, input_ids if request.in_conversation else []
        answer.in_conversation, answer.metadata = request.in_conversation, request.metadata
        return answer

    def _plan_own_context(self, request: AnswerRequest) -> Answer:
        messages: list[InputMessage] = []
        frames: list[Frame] = []
        for part in request.input or []:
            if part.item_id is None:
                messages.append(part)
                continue
            frame = next((f for f in self.buffer.frames if f.frame_id is not None and str(f.frame_id) == part.item_id), None)
            if frame is not None:
                frames.append(frame)
                continue
            found = self.items.retrieve(part.item_id)  # raises item_not_found
            if found.text:
                role = found.role if found.role != "system" else "user"
                messages.append(InputMessage(role=role, text=found.text))
        frames = frames or self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered; send an image first")
        question = "\n".join(m.text for m in messages if m.text and m.role == "user")
        answer = self._plan(frames, question, None, request)
        answer.context, answer.metadata = messages, request.metadata
        answer.in_conversation = request.in_conversation
        return answer

    def plan_recall(self, frames: list[Frame], question: str, request: AnswerRequest | None = None) -> Answer:
        """An answer about the past: over remembered ``frames`` (out of the window) and the
        question only, out of the conversation, so the warm prefix and the timeline stay as
        they are."""
        answer = self._plan(frames, question, None, request)
        answer.context = [InputMessage(role="user", text=question)]
        answer.in_conversation = False
        answer.metadata = request.metadata if request is not None else None
        return answer

    def recall_question(self, request: AnswerRequest) -> str:
        """What a request about the past asks: the user text of its ``input`` (items named by
        id read from the conversation), else the pending inputs' text (used up unless it stays
        out of the conversation). Raises ``invalid_message`` when that is no text."""
        if request.input is not None:
            texts = [self.items.retrieve(m.item_id).text if m.item_id is not None else m.text
                     for m in request.input if m.item_id is not None or m.role == "user"]
        else:
            texts = [i.text for i in self.inputs]
            if request.in_conversation and any(texts):
                self.inputs.clear()
        question = "\n".join(t for t in texts if t).strip()
        if not question:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "a response about a range needs a question in text "
                                                          "(a user message, in the conversation or in response.input)")
        return question

    def plan_watch(self, fire: Fire) -> Answer:
        """The answer to a fired watch: over the buffered frames, asked its watch's question,
        marked with its trigger. Raises ``no_frames``."""
        frames = self.candidate_frames()
        if not frames:
            raise SessionError(ErrorCode.NO_FRAMES, "no frame is buffered for the watch's answer")
        spec = fire.watch.spec
        answer = self._plan(frames, fire.question, None)
        tokens = min(spec.response.max_tokens or WATCH_ANSWER_TOKENS, self.limits.max_answer_tokens)
        answer.sampling = replace(answer.sampling, max_tokens=tokens)
        answer.trigger = WatchTrigger(watch_id=fire.watch.watch_id)
        return answer
