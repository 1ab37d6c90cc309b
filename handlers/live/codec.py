"""The Live codec: Gemini Live (``BidiGenerateContent``) messages <-> the session core's events.

It translates and keeps only what translation needs: the choices ``setup`` made about what
to send (transcriptions, resumption updates), the running answer's output modality, and a
counter of client messages (a frame's id is its message's index). Frames, audio, turn
detection, turns, answers, resume and drain are the core's and the adapter's.

How the core shows up on this protocol, which has no error event and no per-frame acks:

- ``setup`` is the core's ``session.config``; ``session.ready`` is ``setupComplete`` (then a
  ``sessionResumptionUpdate`` with the resume token as its handle, when ``setup`` asked for
  resumption);
- ``realtimeInput.video`` is a ``video.frame``; ``audio`` an ``audio.chunk`` (resampled to
  16 kHz); ``text`` and ``clientContent`` with ``turnComplete`` a ``video.query`` (a blank
  ``text`` asks for an answer to what was given, unless one is already coming);
  ``activityStart`` clears the buffered audio (and stops the running answer, unless
  ``NO_INTERRUPTION``); ``activityEnd`` asks the buffered audio as the question;
  ``clientContent``'s earlier turns (model turns too) are conversation items;
  ``audioStreamEnd`` with activity detection is the silence that ends speech under way;
- an answer is ``serverContent.modelTurn`` parts (text, or ``audio/pcm;rate=24000`` with the
  words as ``outputTranscription``), then ``generationComplete``, then ``turnComplete`` with
  ``usageMetadata``; an interrupted answer ends with ``interrupted``;
- ``session.closing`` (a drain) is ``goAway`` with the time left;
- an ``error`` either closes the connection with a close code and a reason (``CloseConnection``)
  or, for media the session can do without, is logged and skipped: ``CLOSES`` says which.
"""

from __future__ import annotations

import base64
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from handlers.core.events import (
    AnswerAudioDelta,
    AnswerEnded,
    AnswerStarted,
    AnswerTextDelta,
    ErrorReported,
    Event,
    FrameAcked,
    QuestionTranscribed,
    SessionClosing,
    SessionReady,
)
from handlers.live import messages as live
from handlers.media.preparation import decode_base64
from handlers.wire.audio import microphone_audio, speaker_audio
from handlers.wire.client_events import (
    AudioChunkIn,
    ResponseCancel,
    SessionConfig,
    TurnDetectionChange,
    VideoFrame,
    VideoQuery,
    describe_validation_error,
)
from handlers.wire.codec import CloseConnection, CoreInput
from handlers.wire.commands import AnswerRequest, ClearAudio, UserInput
from handlers.wire.errors import ErrorCode, SessionError
from handlers.wire.fields import (
    LIVE_ONLY_FIELDS,
    LIVESIGHT_FIELDS,
    MAX_ANSWER_TOKENS,
    MAX_ITEM_TEXT_CHARS,
    MAX_QUESTION_CHARS,
)
from handlers.wire.running_answer import AnswerTracker
from server.speech.wav import INPUT_RATE, OUTPUT_RATE

log = logging.getLogger("livesight.live")

#: The error codes that close a Live connection, with the close code (the SDK raises each as
#: ``APIError``). The others are logged and the session goes on (``SKIPPED``).
CLOSES: dict[ErrorCode, int] = {
    ErrorCode.INVALID_CONFIG: 1007,
    ErrorCode.INVALID_JSON: 1007,
    ErrorCode.INVALID_MESSAGE: 1007,
    ErrorCode.UNKNOWN_TYPE: 1008,
    ErrorCode.CONFIG_TIMEOUT: 1008,
    ErrorCode.RESUME_FAILED: 1008,
    ErrorCode.UNAUTHORIZED: 1008,
    ErrorCode.FORBIDDEN_ORIGIN: 1008,
    ErrorCode.TOO_MANY_MESSAGES: 1008,
    ErrorCode.TOO_MANY_SESSIONS: 1013,
    ErrorCode.SERVER_CLOSING: 1012,
    ErrorCode.IDLE_TIMEOUT: 1000,
    ErrorCode.ENGINE_ERROR: 1011,
    ErrorCode.INTERNAL_ERROR: 1011,
    ErrorCode.TRANSCRIPTION_FAILED: 1011,
}
#: Skipped with a log line: a frame or an audio chunk the session goes on without, a message
#: dropped by the rate limit, speech that failed (the answer's words still come as text), a
#: blank ``text`` while an answer is coming.
SKIPPED = frozenset(
    {ErrorCode.INVALID_IMAGE, ErrorCode.FRAME_TOO_LARGE, ErrorCode.INVALID_AUDIO, ErrorCode.AUDIO_OVERFLOW,
     ErrorCode.RATE_LIMITED, ErrorCode.SPEECH_FAILED, ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE}
)
#: Close reasons said in Live's words where the core's would mislead a Live client.
_LIVE_REASONS = {
    ErrorCode.RESUME_FAILED: "sessionResumption.handle is unknown, expired, already used or another key's",
}
#: A close reason is at most 123 bytes (RFC 6455).
MAX_REASON_BYTES = 123
IMAGE_TYPES = frozenset({"image/jpeg", "image/jpg", "image/png", "image/webp"})
#: What ``livesight`` in ``setup`` may set: the ``session.config`` fields Live has no name for.
SETUP_LIVESIGHT_FIELDS = frozenset(LIVESIGHT_FIELDS + LIVE_ONLY_FIELDS)
#: Silence past the session's ``silence_ms`` that ``audioStreamEnd`` stands for.
STREAM_END_MARGIN_MS = 100
_SENSITIVITY = {"START_SENSITIVITY_HIGH": 0.3, "START_SENSITIVITY_LOW": 0.7}
_MODALITY = {"text_tokens": "TEXT", "image_tokens": "IMAGE", "audio_tokens": "AUDIO"}


def standard_base64(data: str) -> str:
    """Base64 in either alphabet, padded or not, as standard padded base64 (the core's)."""
    if "-" in data or "_" in data:
        data = data.replace("-", "+").replace("_", "/")
    if len(data) % 4:
        data += "=" * (-len(data) % 4)
    return data


def audio_rate(mime_type: str | None) -> int:
    """The sample rate of a Live audio blob (``audio/pcm;rate=16000``; no rate: 16 kHz).
    Raises ``invalid_audio`` for another type or a rate outside 8-48 kHz."""
    kind, _, params = (mime_type or "audio/pcm").partition(";")
    if kind.strip().lower() not in {"audio/pcm", "audio/l16"}:
        raise SessionError(
            ErrorCode.INVALID_AUDIO, f"audio must be audio/pcm (16-bit little-endian), not {kind[:40]!r}"
        )
    rate = INPUT_RATE
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "rate":
            if not value.strip().isdigit() or not 8000 <= int(value) <= 48000:
                raise SessionError(ErrorCode.INVALID_AUDIO, "audio rate must be 8000-48000 Hz")
            rate = int(value)
    return rate


def _reason(text: str) -> str:
    raw = text.encode("utf-8")[:MAX_REASON_BYTES]
    return raw.decode("utf-8", "ignore")


def _duration(ms: float) -> str:
    """Milliseconds as a proto3 JSON duration (``"12.5s"``)."""
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"


class LiveCodec:
    """One Live connection's translation (a ``WireCodec``)."""

    #: The buffered microphone audio becomes a question when it is asked (``activityEnd``)
    #: or ends (turn detection), so it is transcribed while it arrives.
    commits_audio = False

    def __init__(self, max_message_bytes: int | None = None) -> None:
        self._max_bytes = max_message_bytes  # the server's max_message_bytes (None: the transport's only)
        self._prefix = uuid.uuid4().hex[:6]  # frame ids stay unique in a resumed session
        self._index = itertools.count()  # client messages, setup = 0
        self._configured = False
        self._resumption = False
        self._transparent = False
        self._handle: str | None = None
        self._input_words = False  # inputAudioTranscription asked
        self._output_words = False  # outputAudioTranscription asked
        self._interrupts = True  # activityStart stops the running answer
        self._manual = False  # automatic activity detection disabled: activityStart/End
        self._answers = AnswerTracker()  # the running answer: whether it speaks
        self._silence_ms: int | None = None  # the session's silence that ends speech (turn detection on)

    # ------------------------------------------------------------------ connect
    def opening(self) -> list[CoreInput]:
        """The first message must be ``setup``."""
        return []

    # ------------------------------------------------------------------ client -> core
    def decode(self, raw: str | bytes) -> list[CoreInput]:
        index = next(self._index)
        if not self._configured:
            try:
                message = live.parse_client_message(raw, max_bytes=self._max_bytes)
                if message.setup is None:
                    raise SessionError(
                        ErrorCode.INVALID_CONFIG, f"the first message must be setup, not {message.kind()}"
                    )
                config = self._setup(message.setup)
            except SessionError as exc:
                if exc.code is ErrorCode.INVALID_CONFIG:
                    raise
                raise SessionError(ErrorCode.INVALID_CONFIG, f"setup: {exc.message}") from None
            self._configured = True
            return [config]
        message = live.parse_client_message(raw, max_bytes=self._max_bytes)
        if message.setup is not None:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "setup was already sent: a session takes one setup")
        if message.tool_response is not None:
            raise SessionError(ErrorCode.UNKNOWN_TYPE, "toolResponse: this server makes no tool calls")
        if message.realtime_input is not None:
            return self._realtime(message.realtime_input, index)
        assert message.client_content is not None
        return self._content(message.client_content, index)

    def _setup(self, setup: live.Setup) -> SessionConfig:
        if setup.tools:
            raise SessionError(ErrorCode.INVALID_CONFIG, "tools (function calling, search, code) are not supported")
        gen = setup.generation_config or live.GenerationConfig()
        modalities = gen.response_modalities or ["AUDIO"]
        if len(set(modalities)) > 1:
            raise SessionError(ErrorCode.INVALID_CONFIG, "responseModalities takes one of TEXT or AUDIO")
        sampling: dict[str, Any] = {}
        if gen.temperature is not None:
            sampling["temperature"] = gen.temperature
        if gen.top_p is not None:
            sampling["top_p"] = gen.top_p
        if gen.seed is not None:
            sampling["seed"] = gen.seed
        if gen.max_output_tokens is not None:
            sampling["max_tokens"] = min(gen.max_output_tokens, MAX_ANSWER_TOKENS)
        voice = None
        speech = gen.speech_config.voice_config if gen.speech_config else None
        if speech and speech.prebuilt_voice_config:
            voice = speech.prebuilt_voice_config.voice_name
        fields: dict[str, Any] = {
            "model": setup.model,
            "modalities": ["text", "audio"] if modalities == ["AUDIO"] else ["text"],
            "system_prompt": _instruction(setup.system_instruction),
            "voice": voice,
            "turn_detection": self._turn_detection(setup.realtime_input_config),
        }
        if sampling:
            fields["sampling"] = sampling
        extra = setup.livesight or {}
        unknown = sorted(set(extra) - SETUP_LIVESIGHT_FIELDS)
        if unknown:
            raise SessionError(ErrorCode.INVALID_CONFIG, f"livesight: unknown fields {', '.join(unknown)[:80]}")
        if extra.get("watches") and not (setup.proactivity and setup.proactivity.proactive_audio):
            raise SessionError(
                ErrorCode.INVALID_CONFIG, "livesight.watches speak unasked: set proactivity.proactiveAudio"
            )
        fields.update(extra)
        resumption = setup.session_resumption
        if resumption is not None:
            self._resumption = True
            self._transparent = bool(resumption.transparent)
            fields["resume_token"] = resumption.handle or None
        self._input_words = setup.input_audio_transcription is not None
        self._output_words = setup.output_audio_transcription is not None
        try:
            return SessionConfig.model_validate(fields)
        except ValidationError as exc:
            raise SessionError(ErrorCode.INVALID_CONFIG, describe_validation_error(exc)) from None

    def _turn_detection(self, config: live.RealtimeInputConfig | None) -> dict[str, Any] | None:
        config = config or live.RealtimeInputConfig()
        self._interrupts = config.activity_handling != "NO_INTERRUPTION"
        aad = config.automatic_activity_detection or live.AutomaticActivityDetection()
        self._manual = bool(aad.disabled)
        if self._manual:
            return None
        threshold = _SENSITIVITY.get(aad.start_of_speech_sensitivity or "")
        return TurnDetectionChange(
            threshold=threshold, silence_ms=aad.silence_duration_ms, prefix_padding_ms=aad.prefix_padding_ms,
            interrupt_response=self._interrupts,
        ).as_config()

    def _realtime(self, event: live.RealtimeInput, index: int) -> list[CoreInput]:
        given = [name for name in type(event).model_fields if getattr(event, name) is not None]
        if len(given) != 1:
            raise SessionError(ErrorCode.INVALID_MESSAGE, "realtimeInput holds exactly one input")
        if event.video is not None:
            return [self._blob(event.video, f"{self._prefix}.{index}")]
        if event.audio is not None:
            return [self._blob(event.audio, None)]
        if event.media_chunks is not None:
            return [self._blob(blob, f"{self._prefix}.{index}.{n}") for n, blob in enumerate(event.media_chunks)]
        if event.text is not None and not event.text.strip():
            return [AnswerRequest(exclusive=True)]  # a nudge (Pipecat sends " "): answer, unless an answer is coming
        if event.text is not None:
            return [VideoQuery(type="video.query", text=event.text)]
        if event.activity_start is not None or event.activity_end is not None:
            if not self._manual:
                raise SessionError(
                    ErrorCode.INVALID_MESSAGE,
                    "activityStart/activityEnd need realtimeInputConfig.automaticActivityDetection.disabled",
                )
            if event.activity_end is not None:
                return [VideoQuery(type="video.query", text="")]  # the audio since activityStart is the question
            stop = [ResponseCancel(type="response.cancel")] if self._interrupts else []
            return [*stop, ClearAudio()]
        if self._manual or self._silence_ms is None:
            return []  # audioStreamEnd without activity detection: activityEnd ends a turn
        # The microphone stopped: from the detector's side that is silence, so speech under way
        # ends (and is answered) as it would had the user gone quiet.
        silence = bytes(INPUT_RATE * 2 * (self._silence_ms + STREAM_END_MARGIN_MS) // 1000)
        return [AudioChunkIn(type="audio.chunk", data=base64.b64encode(silence).decode("ascii"))]

    def _blob(self, blob: live.Blob, frame_id: str | None) -> CoreInput:
        """An image blob as a frame (``frame_id``), an audio blob as microphone audio (16 kHz)."""
        mime = (blob.mime_type or "").lower()
        if frame_id is not None and not mime.startswith("audio/"):
            if mime and mime not in IMAGE_TYPES:
                raise SessionError(
                    ErrorCode.INVALID_IMAGE, f"video must be image/jpeg, image/png or image/webp, not {mime[:40]!r}"
                )
            return VideoFrame(type="video.frame", data=standard_base64(blob.data), frame_id=frame_id)
        rate = audio_rate(blob.mime_type)
        raw = decode_base64(standard_base64(blob.data), ErrorCode.INVALID_AUDIO, "audio")
        return AudioChunkIn(type="audio.chunk", data=microphone_audio(raw, rate))

    def _content(self, content: live.ClientContent, index: int) -> list[CoreInput]:
        """Images are frames; each turn's text is a conversation item (a ``model`` turn the
        assistant's), except, with ``turnComplete``, the user's text after the last model
        turn: that is the question."""
        frames: list[CoreInput] = []
        texts: list[tuple[str, str]] = []  # (role, text) of each turn
        for t, turn in enumerate(content.turns or []):
            if turn.role not in {None, "user", "model"}:
                raise SessionError(
                    ErrorCode.INVALID_MESSAGE, f"clientContent turns are user or model turns, not {turn.role[:20]!r}"
                )
            role = "assistant" if turn.role == "model" else "user"
            words = []
            for n, part in enumerate(turn.parts):
                if part.inline_data is not None and role == "assistant":
                    raise SessionError(ErrorCode.INVALID_MESSAGE, "a model turn holds text only")
                if part.inline_data is not None:
                    frames.append(self._blob(part.inline_data, f"{self._prefix}.{index}.{t}.{n}"))
                elif part.text:
                    words.append(part.text)
            if words:
                texts.append((role, "\n".join(words)))
        question: list[str] = []
        if content.turn_complete:
            while texts and texts[-1][0] == "user":
                question.insert(0, texts.pop()[1])
        if any(len(text) > MAX_ITEM_TEXT_CHARS for _, text in texts) or len("\n".join(question)) > MAX_QUESTION_CHARS:
            raise SessionError(
                ErrorCode.INVALID_MESSAGE, f"clientContent: a turn's text is at most {MAX_QUESTION_CHARS} characters"
            )
        items: list[CoreInput] = [
            UserInput(item_id=f"{self._prefix}.{index}.{n}", role=role, text=text)
            for n, (role, text) in enumerate(texts)
        ]
        asked: list[CoreInput] = []
        if content.turn_complete:
            asked.append(VideoQuery(type="video.query", text="\n".join(question)))
        return [*frames, *items, *asked]

    # ------------------------------------------------------------------ core -> client
    def encode(self, event: Event) -> list[str]:
        encoder = _ENCODERS.get(type(event))
        if encoder is None:
            return []  # no Live counterpart: frames consumed, speech started/stopped, items, pong
        return [m.encode() for m in encoder(self, event)]

    def _response_start(self, event: AnswerStarted) -> list[live.ServerMessage]:
        self._answers.start(event, event.item_id or event.request_id)
        return []

    def _text_delta(self, event: AnswerTextDelta) -> list[live.ServerMessage]:
        if not self._answers.speaking:
            return [_content(model_turn=live.ModelTurn(parts=[live.OutPart(text=event.delta)]))]
        if self._output_words:
            return [_content(output_transcription=live.Transcription(text=event.delta))]
        return []

    def _question_transcript(self, event: QuestionTranscribed) -> list[live.ServerMessage]:
        if not self._input_words:
            return []
        return [_content(input_transcription=live.Transcription(text=event.transcript, finished=True))]

    def _closing(self, event: SessionClosing) -> list[live.ServerMessage]:
        return [live.ServerMessage(go_away=live.GoAway(time_left=_duration(event.deadline_ms)))]

    def _ready(self, event: SessionReady) -> list[live.ServerMessage]:
        for note in event.notes:
            log.info("setup: %s", note)
        if event.config.get("turn_detection") is not None and not event.capabilities.get("turn_detection"):
            log.warning("setup: automatic activity detection is off on this server (server_vad)")
        vad = event.config.get("turn_detection")
        self._silence_ms = int(vad["silence_ms"]) if isinstance(vad, dict) and "silence_ms" in vad else None
        out = [live.ServerMessage(setup_complete=live.SetupComplete(session_id=event.session_id))]
        self._handle = event.resume_token
        if self._resumption:
            out.append(self._resumption_update(None if not event.resumed else event.last_frame_id))
        return out

    def _resumption_update(self, frame_id: object) -> live.ServerMessage:
        index = None
        if self._transparent and isinstance(frame_id, str):
            index = frame_id.split(".")[1] if "." in frame_id else None
        return live.ServerMessage(
            session_resumption_update=live.SessionResumptionUpdate(
                new_handle=self._handle, resumable=self._handle is not None, last_consumed_client_message_index=index,
            )
        )

    def _frame(self, ack: FrameAcked) -> list[live.ServerMessage]:
        if ack.reason == "overloaded":
            log.debug("frame %s shed: the server is overloaded", ack.frame_id)
        elif self._resumption and self._transparent and isinstance(ack.frame_id, str):
            if ack.frame_id.startswith(self._prefix):
                return [self._resumption_update(ack.frame_id)]
        return []

    def _audio(self, event: AnswerAudioDelta) -> list[live.ServerMessage]:
        try:
            pcm = speaker_audio(event.data, OUTPUT_RATE)
        except ValueError as exc:
            log.warning("engine audio could not be converted: %s", exc)
            return []
        data = base64.b64encode(pcm).decode("ascii")
        blob = live.InlineData(mime_type=f"audio/pcm;rate={OUTPUT_RATE}", data=data)
        return [_content(model_turn=live.ModelTurn(parts=[live.OutPart(inline_data=blob)]))]

    def _done(self, event: AnswerEnded) -> list[live.ServerMessage]:
        self._answers.finish()
        usage = _usage(event)
        if event.status == "completed":
            return [
                _content(generation_complete=True),
                live.ServerMessage(server_content=live.ServerContent(turn_complete=True), usage_metadata=usage),
            ]
        if event.status == "interrupted" and event.interrupted_by != "session_end":
            return [live.ServerMessage(server_content=live.ServerContent(interrupted=True), usage_metadata=usage)]
        return []  # failed: its error closed the connection; session_end: nobody is listening

    def _error(self, event: ErrorReported) -> list[live.ServerMessage]:
        code = ErrorCode(event.code)
        if code in CLOSES:
            message = _LIVE_REASONS.get(code) or event.message.replace("session.config", "setup")
            raise CloseConnection(CLOSES[code], _reason(message))
        if code is ErrorCode.NO_FRAMES:
            log.info("a question with no frame buffered: its turn ends empty")
            empty = live.UsageMetadata(prompt_token_count=0, cached_content_token_count=0, response_token_count=0,
                                       total_token_count=0, prompt_tokens_details=[], response_tokens_details=[])
            return [live.ServerMessage(server_content=live.ServerContent(turn_complete=True), usage_metadata=empty)]
        log.info("skipped: %s (%s)", event.message, event.code)
        return []


def _content(**fields: Any) -> live.ServerMessage:
    return live.ServerMessage(server_content=live.ServerContent(**fields))


def _instruction(instruction: live.Content | str | None) -> str | None:
    """``systemInstruction`` (text parts, or a plain string) as the system prompt."""
    if instruction is None or isinstance(instruction, str):
        return instruction or None
    if any(part.inline_data is not None for part in instruction.parts):
        raise SessionError(ErrorCode.INVALID_CONFIG, "systemInstruction takes text parts only")
    return "\n".join(part.text for part in instruction.parts if part.text) or None


def _usage(event: AnswerEnded) -> live.UsageMetadata:
    usage = event.usage
    details = [
        live.ModalityTokenCount(modality=modality, token_count=getattr(usage, name))
        for name, modality in _MODALITY.items()
        if getattr(usage, name)
    ]
    return live.UsageMetadata(
        prompt_token_count=usage.prompt_tokens,
        cached_content_token_count=usage.cached_tokens,
        response_token_count=usage.completion_tokens,
        total_token_count=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=details,
        response_tokens_details=[live.ModalityTokenCount(modality="TEXT", token_count=usage.completion_tokens)],
    )


#: Each core event's translation into Live messages (a core event not here has none).
_ENCODERS: dict[type, Callable[[LiveCodec, Any], list[live.ServerMessage]]] = {
    SessionReady: LiveCodec._ready,
    AnswerStarted: LiveCodec._response_start,
    AnswerTextDelta: LiveCodec._text_delta,
    AnswerAudioDelta: LiveCodec._audio,
    QuestionTranscribed: LiveCodec._question_transcript,
    AnswerEnded: LiveCodec._done,
    FrameAcked: LiveCodec._frame,
    SessionClosing: LiveCodec._closing,
    ErrorReported: LiveCodec._error,
}
