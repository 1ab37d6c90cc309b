"""The Realtime codec: OpenAI Realtime messages <-> the session core's events.

It translates and keeps only what translation needs: the session's audio formats, the ids
it gave to items and to the running response, and the pieces of that response's output
item. Why an answer ended comes with its ``response.done`` (``interrupted_by``, ``error_code``:
``turn_detected`` when speech interrupted it, ``client_cancelled`` otherwise). Frames, audio
buffers, turns and answers are the core's.

How core events show up:

- a camera frame is a user item with one ``input_image``: its ack becomes
  ``conversation.item.added`` + ``.done``; a frame the similarity filter drops is added,
  done with ``status: "incomplete"`` and deleted at once; a frame evicted from the buffer is
  ``conversation.item.deleted``. The conversation holds exactly the frames the model sees.
- an answer is one response with one assistant message item and one content part (``text``
  or ``audio`` with its transcript); the item's id is the core's (the core deletes,
  retrieves and truncates it), and the client's ``metadata`` comes back with it.

Every error caused by a client event carries that event's ``event_id``, and OpenAI's code
where it has one for the problem (``_OPENAI_CODES``; the rest keep livesight's).
"""

from __future__ import annotations

import base64
import itertools
import logging
import uuid
from typing import Any

from pydantic import ValidationError

from handlers.wire.codec import CoreInput
from handlers.wire.commands import (
    AnswerRequest,
    AudioCleared,
    AudioCommitted,
    CancelRequest,
    ClearAudio,
    ClearOutputAudio,
    CommitAudio,
    ConfigUpdate,
    ConfigUpdated,
    DeleteItem,
    IdleTimeout,
    InputAdded,
    InputMessage,
    InputTranscribed,
    ItemDeleted,
    ItemRetrieved,
    ItemTruncated,
    OutputAudioCleared,
    RetrieveItem,
    TruncateItem,
    UserInput,
    from_wire,
)
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.protocol import (
    AudioChunkIn,
    ErrorEvent,
    FrameAck,
    InputAudioSpeechStarted,
    InputAudioSpeechStopped,
    InputAudioTranscript,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTextDone,
    ServerEvent,
    SessionConfig,
    SessionReady,
    VideoFrame,
    describe_validation_error,
)
from handlers.realtime import events as rt
from handlers.realtime.audio import audio_in, audio_out

log = logging.getLogger("livesight.realtime")

#: The core's errors that are the server's fault, not the client's.
_SERVER_ERRORS = frozenset(
    {ErrorCode.ENGINE_ERROR, ErrorCode.INTERNAL_ERROR, ErrorCode.SPEECH_FAILED, ErrorCode.TRANSCRIPTION_FAILED}
)
_LIVESIGHT_FIELDS = tuple(rt.LivesightSettings.model_fields)
#: OpenAI's code for a livesight error, by the client event that caused it (None: any event).
_OPENAI_CODES: dict[tuple[str, str | None], str] = {
    (ErrorCode.UNKNOWN_TYPE, None): "invalid_value",
    (ErrorCode.INVALID_MESSAGE, None): "invalid_value",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.retrieve"): "item_retrieve_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.delete"): "item_delete_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.truncate"): "item_truncate_invalid_item_id",
    (ErrorCode.ITEM_NOT_FOUND, "conversation.item.create"): "item_create_invalid_previous_item_id",
    (ErrorCode.DUPLICATE_ITEM_ID, None): "item_create_duplicate_item_id",
    (ErrorCode.INVALID_TRUNCATE, None): "unsupported_content_type",
    (ErrorCode.INVALID_AUDIO, "input_audio_buffer.commit"): "input_audio_buffer_commit_empty",
}


def openai_code(code: str, event_type: str | None) -> str:
    """The code an error gets on /v1/realtime: OpenAI's where it has one, else livesight's."""
    return _OPENAI_CODES.get((code, event_type)) or _OPENAI_CODES.get((code, None)) or code


def core_modalities(output_modalities: list[str]) -> list[str]:
    """Realtime's ``["audio"]`` (speech with its transcript) is the core's ``["text", "audio"]``."""
    return ["text", "audio"] if "audio" in output_modalities else ["text"]


class _Answer:
    """The running response as the client sees it."""

    def __init__(
        self, response_id: str, item_id: str, audio: bool, metadata: dict[str, str] | None = None,
        in_conversation: bool = True,
    ) -> None:
        self.response_id = response_id
        self.item_id = item_id
        self.audio = audio
        self.metadata = metadata  # the client's; or a fired watch's answer: which watch
        self.in_conversation = in_conversation
        self.text = ""
        self.sent_audio = False

    def ids(self) -> dict[str, Any]:
        return {"response_id": self.response_id, "item_id": self.item_id}

    def item(self, status: str) -> rt.Item:
        if status == "in_progress":
            content: list[rt.ItemContent] = []
        elif self.audio:
            content = [rt.ItemContent(type="output_audio", transcript=self.text)]
        else:
            content = [rt.ItemContent(type="output_text", text=self.text)]
        return rt.Item(id=self.item_id, role="assistant", status=status, content=content)

    def part(self) -> rt.ContentPartOut:
        if self.audio:
            return rt.ContentPartOut(type="audio", transcript=self.text)
        return rt.ContentPartOut(type="text", text=self.text)


class RealtimeCodec:
    """One Realtime connection's translation (a ``WireCodec``)."""

    #: Audio becomes a question only when the client commits it (or server VAD ends it):
    #: without turn detection nothing is transcribed before the commit.
    commits_audio = True

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.session_id = f"sess_{uuid.uuid4().hex[:20]}"
        self.in_format = rt.AudioFormat()
        self.out_format = rt.AudioFormat()
        self.transcription: dict[str, Any] | None = None
        self.noise_reduction: dict[str, Any] | None = None
        self.config: dict[str, Any] = {}  # the core's effective configuration
        self.vad_type = "server_vad"  # what the client asked for (semantic_vad is served by server VAD)
        self.eagerness: str = "auto"
        self.refused: list[str] = []  # the last session.update's parts that were not applied
        self.notes: list[str] = []  # what the server changed of what was asked (the core's notes)
        self.ignored: list[str] = []  # the last session.update's fields this server does not know
        self._last_response: str | None = None
        self._event_ids = itertools.count(1)
        self._item_ids = itertools.count(1)
        self._speech_item: str | None = None  # the item of the speech being heard
        self._question_audio_item: str | None = None  # the audio item the next transcript belongs to
        self._answer: _Answer | None = None

    # ------------------------------------------------------------------ connect
    def opening(self) -> list[CoreInput]:
        """A session starts configured (text answers, no turn detection): ``session.created`` goes out at once."""
        return [SessionConfig(model=self.model)]

    # ------------------------------------------------------------------ client -> core
    def decode(self, raw: str | bytes) -> list[CoreInput]:
        event, _ = rt.parse_realtime_event(raw)  # its errors carry the event's origin
        origin = Origin(event.event_id, event.type)
        try:
            return [from_wire(core, origin) for core in self._decode(event)]
        except SessionError as exc:
            exc.origin = origin
            raise
        except ValidationError as exc:  # a command out of the core's bounds (text too long, ...)
            error = SessionError(ErrorCode.INVALID_MESSAGE, f"{event.type}: {describe_validation_error(exc)}")
            error.origin = origin
            raise error from None

    def _decode(self, event: rt.RealtimeClientEvent) -> list[CoreInput]:
        if isinstance(event, rt.SessionUpdate):
            return [ConfigUpdate(changes=self._config_changes(event.session), refused=event._refused,
                                 ignored=event._ignored)]
        if isinstance(event, rt.InputAudioBufferAppend):
            return [AudioChunkIn(type="audio.chunk", data=audio_in(event.audio, self.in_format.type))]
        if isinstance(event, rt.InputAudioBufferCommit):
            return [CommitAudio(item_id=self._new_item())]
        if isinstance(event, rt.InputAudioBufferClear):
            return [ClearAudio()]
        if isinstance(event, rt.ConversationItemCreate):
            return self._item(event.item, event.previous_item_id)
        if isinstance(event, rt.ConversationItemDelete):
            return [DeleteItem(item_id=event.item_id)]
        if isinstance(event, rt.ConversationItemRetrieve):
            return [RetrieveItem(item_id=event.item_id)]
        if isinstance(event, rt.ConversationItemTruncate):
            return [TruncateItem(item_id=event.item_id, content_index=event.content_index, audio_end_ms=event.audio_end_ms)]
        if isinstance(event, rt.OutputAudioBufferClear):
            return [ClearOutputAudio()]
        if isinstance(event, rt.ResponseCreate):
            return [self._answer_request(event.response or rt.ResponseParams())]
        if isinstance(event, rt.ResponseCancel):
            return [CancelRequest()]
        raise SessionError(ErrorCode.UNKNOWN_TYPE, f"unsupported event type {event.type!r}")

    def _config_changes(self, session: rt.RealtimeSession) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        given = session.model_fields_set
        if "instructions" in given:
            changes["system_prompt"] = session.instructions or None
        if session.output_modalities is not None:
            changes["modalities"] = core_modalities(session.output_modalities)
        if session.max_output_tokens is not None:
            changes["sampling"] = {**self.config.get("sampling", {}), "max_tokens": _max_tokens(session.max_output_tokens)}
        audio = session.audio or rt.SessionAudio()
        if audio.input is not None:
            if audio.input.format is not None:
                self.in_format = audio.input.format
            if "transcription" in audio.input.model_fields_set:
                self.transcription = audio.input.transcription
            if "noise_reduction" in audio.input.model_fields_set:
                self.noise_reduction = audio.input.noise_reduction
            if "turn_detection" in audio.input.model_fields_set:
                changes["turn_detection"] = self._turn_detection(audio.input.turn_detection)
        if audio.output is not None:
            if audio.output.format is not None:
                self.out_format = audio.output.format
            if audio.output.voice is not None:
                changes["voice"] = audio.output.voice
            if audio.output.speed is not None:
                changes["speech_rate"] = min(2.0, max(0.5, audio.output.speed))
        if session.livesight is not None:
            changes.update(session.livesight.model_dump(exclude_unset=True))
        return changes

    def _turn_detection(self, vad: rt.ServerVad | rt.SemanticVad | None) -> dict[str, Any] | None:
        """Turn detection as the core's: ``semantic_vad`` is the server's VAD with the silence
        its eagerness asks for (``SEMANTIC_SILENCE_MS``)."""
        if vad is None:
            return None
        self.vad_type = vad.type
        if isinstance(vad, rt.SemanticVad):
            self.eagerness = vad.eagerness or "auto"
            wanted = {"silence_ms": rt.SEMANTIC_SILENCE_MS[self.eagerness]}
        else:
            wanted = {"threshold": vad.threshold, "silence_ms": vad.silence_duration_ms,
                      "prefix_padding_ms": vad.prefix_padding_ms, "idle_timeout_ms": vad.idle_timeout_ms}
        wanted |= {"create_response": vad.create_response, "interrupt_response": vad.interrupt_response}
        return {k: v for k, v in wanted.items() if v is not None}

    def _item(self, item: rt.MessageItem, previous_item_id: str | None = None) -> list[CoreInput]:
        item_id = item.id or self._new_item()
        texts = [part.text for part in item.content if part.type in {"input_text", "text", "output_text"} and part.text]
        images = [part for part in item.content if part.type == "input_image"]
        audios = [part for part in item.content if part.type == "input_audio"]
        if item.role == "assistant":
            spoken = [p.transcript for p in item.content if p.type in {"output_audio", "audio"} and p.transcript]
            if images or audios:
                raise SessionError(ErrorCode.INVALID_MESSAGE, "an assistant item holds text or audio with its transcript")
            return [UserInput(item_id=item_id, role="assistant", text="\n".join(texts + spoken),
                              previous_item_id=previous_item_id)]
        if item.role == "system":
            if images or audios:
                raise SessionError(ErrorCode.INVALID_MESSAGE, "a system item holds input_text only")
            return [UserInput(item_id=item_id, role="system", text="\n".join(texts), previous_item_id=previous_item_id)]
        out: list[CoreInput] = []
        for n, part in enumerate(images):
            if not part.image_url or not part.image_url.startswith("data:"):
                raise SessionError(ErrorCode.INVALID_IMAGE, "input_image needs image_url as a data URL (data:image/jpeg;base64,...)")
            alone = len(images) == 1 and not texts and not audios
            out.append(VideoFrame(type="video.frame", data=part.image_url, frame_id=item_id if alone else f"{item_id}.{n}",
                                  detail=part.detail))
        pcm = b""
        for part in audios:
            if not part.audio:
                raise SessionError(ErrorCode.INVALID_AUDIO, "input_audio needs audio")
        if audios:
            pcm = b"".join(base64.b64decode(audio_in(part.audio or "", self.in_format.type)) for part in audios)
        if texts or pcm:
            audio = base64.b64encode(pcm).decode("ascii") if pcm else None
            out.append(UserInput(item_id=item_id, text="\n".join(texts) or None, audio=audio,
                                 previous_item_id=previous_item_id))
        return out

    def _answer_request(self, response: rt.ResponseParams) -> AnswerRequest:
        if response.audio is not None and response.audio.output is not None and response.audio.output.format is not None:
            self.out_format = response.audio.output.format
        context = None
        if response.input is not None:
            context = []
            for part in response.input:
                if isinstance(part, rt.ItemReference):
                    context.append(InputMessage(item_id=part.id))
                    continue
                if any(p.type in {"input_image", "input_audio"} for p in part.content):
                    raise SessionError(ErrorCode.INVALID_MESSAGE, "response.input takes images and audio only as "
                                       "item_reference to conversation items")
                text = "\n".join(p.text or p.transcript or "" for p in part.content).strip()
                context.append(InputMessage(role=part.role, text=text or None))
        return AnswerRequest(
            instructions=response.instructions,
            modalities=core_modalities(response.output_modalities) if response.output_modalities else None,
            max_tokens=_max_tokens(response.max_output_tokens) if response.max_output_tokens is not None else None,
            exclusive=True, in_conversation=response.conversation != "none", input=context,
            metadata=response.metadata,
        )

    # ------------------------------------------------------------------ core -> client
    def encode(self, event: ServerEvent) -> list[str]:
        return [rt.encode_realtime(out) for out in self._encode(event)]

    def _encode(self, event: ServerEvent) -> list[rt.RealtimeServerEvent]:
        if isinstance(event, SessionReady):
            self.config, self.notes = event.config, event.notes
            return [rt.SessionCreated(event_id=self._eid(), session=self._session())]
        if isinstance(event, ConfigUpdated):
            self.config = event.config
            self.refused, self.notes, self.ignored = event.refused, event.notes, event.ignored
            return [rt.SessionUpdated(event_id=self._eid(), session=self._session())]
        if isinstance(event, FrameAck):
            return self._frame(event)
        if isinstance(event, InputAdded):
            content = []
            if event.text:
                content.append(rt.ItemContent(type="input_text", text=event.text))
            if event.audio_ms is not None:
                content.append(rt.ItemContent(type="input_audio"))
                self._question_audio_item = event.item_id
            if event.role == "assistant":
                content = [rt.ItemContent(type="output_text", text=event.text or "")]
            item = rt.Item(id=event.item_id, role=event.role, content=content)
            return self._added(item, event.previous_item_id)
        if isinstance(event, AudioCommitted):
            self._question_audio_item = event.item_id
            previous = event.previous_item_id
            committed = rt.AudioBufferCommitted(event_id=self._eid(), previous_item_id=previous, item_id=event.item_id)
            return [committed, *self._added(_audio_item(event.item_id), previous)]
        if isinstance(event, AudioCleared):
            return [rt.AudioBufferCleared(event_id=self._eid())]
        if isinstance(event, ItemDeleted):
            return [rt.ConversationItemDeleted(event_id=self._eid(), item_id=event.item_id)]
        if isinstance(event, ItemRetrieved):
            return [rt.ConversationItemRetrieved(event_id=self._eid(), item=_retrieved(event))]
        if isinstance(event, ItemTruncated):
            return [rt.ConversationItemTruncated(event_id=self._eid(), item_id=event.item_id,
                                                 content_index=event.content_index, audio_end_ms=event.audio_end_ms)]
        if isinstance(event, IdleTimeout):
            return [rt.TimeoutTriggered(event_id=self._eid(), item_id=event.item_id,
                                        audio_start_ms=int(event.audio_start_ms), audio_end_ms=int(event.audio_end_ms))]
        if isinstance(event, OutputAudioCleared):
            response_id = self._last_response or f"resp_{self.session_id[5:13]}_none"
            return [rt.OutputAudioBufferCleared(event_id=self._eid(), response_id=response_id)]
        if isinstance(event, InputAudioSpeechStarted):
            self._speech_item = event.item_id or self._new_item()
            return [rt.SpeechStarted(event_id=self._eid(), audio_start_ms=int(event.audio_start_ms), item_id=self._speech_item)]
        if isinstance(event, InputAudioSpeechStopped):
            item_id = event.item_id or self._speech_item or self._new_item()
            self._speech_item = None
            self._question_audio_item = item_id
            stopped = rt.SpeechStopped(event_id=self._eid(), audio_end_ms=int(event.audio_end_ms), item_id=item_id)
            previous = event.previous_item_id
            committed = rt.AudioBufferCommitted(event_id=self._eid(), previous_item_id=previous, item_id=item_id)
            return [stopped, committed, *self._added(_audio_item(item_id), previous)]
        if isinstance(event, InputAudioTranscript):
            item_id = self._question_audio_item or self._new_item()
            return [
                rt.TranscriptionCompleted(
                    event_id=self._eid(), item_id=item_id, transcript=event.transcript,
                    usage=rt.TranscriptionUsage(seconds=round(event.audio_ms / 1000, 3)),
                )
            ]
        if isinstance(event, InputTranscribed):
            return [
                rt.TranscriptionCompleted(
                    event_id=self._eid(), item_id=event.item_id, transcript=event.transcript,
                    usage=rt.TranscriptionUsage(seconds=round(event.audio_ms / 1000, 3)),
                )
            ]
        if isinstance(event, ResponseStart):
            return self._response_start(event)
        if isinstance(event, ResponseTextDelta) and self._answer is not None:
            answer = self._answer
            answer.text += event.delta
            if answer.audio:
                return [rt.OutputAudioTranscriptDelta(event_id=self._eid(), delta=event.delta, **answer.ids())]
            return [rt.OutputTextDelta(event_id=self._eid(), delta=event.delta, **answer.ids())]
        if isinstance(event, ResponseTextDone) and self._answer is not None:
            answer = self._answer
            if answer.audio:
                return [rt.OutputAudioTranscriptDone(event_id=self._eid(), transcript=event.text, **answer.ids())]
            return [rt.OutputTextDone(event_id=self._eid(), text=event.text, **answer.ids())]
        if isinstance(event, ResponseAudioDelta) and self._answer is not None:
            try:
                delta = audio_out(base64.b64decode(event.data), self.out_format.type)
            except ValueError as exc:
                log.warning("engine audio could not be converted: %s", exc)
                return []
            self._answer.sent_audio = True
            return [rt.OutputAudioDelta(event_id=self._eid(), delta=delta, **self._answer.ids())]
        if isinstance(event, ResponseAudioDone) and self._answer is not None:
            return [rt.OutputAudioDone(event_id=self._eid(), **self._answer.ids())]
        if isinstance(event, ResponseDone) and self._answer is not None:
            return self._response_done(event)
        if isinstance(event, ErrorEvent):
            return [self._error(event)]
        return []  # events with no Realtime counterpart (frames consumed, pong, session done)

    def _frame(self, ack: FrameAck) -> list[rt.RealtimeServerEvent]:
        out: list[rt.RealtimeServerEvent] = []
        if ack.frame_id is not None:
            item = rt.Item(id=str(ack.frame_id), role="user", content=[rt.ItemContent(type="input_image")])
            if ack.accepted:
                out += self._added(item, ack.previous_item_id)
            else:  # filtered: shown, then taken out, so the conversation holds what the model sees
                out += self._added(item, ack.previous_item_id, done_status="incomplete")
                out.append(rt.ConversationItemDeleted(event_id=self._eid(), item_id=str(ack.frame_id)))
        for dropped in ack.dropped_frame_ids:
            out.append(rt.ConversationItemDeleted(event_id=self._eid(), item_id=str(dropped)))
        return out

    def _response_start(self, event: ResponseStart) -> list[rt.RealtimeServerEvent]:
        trigger = event.trigger
        metadata = event.metadata
        if trigger is not None:
            metadata = {**(metadata or {}), "livesight_trigger": trigger.type, "watch_id": trigger.watch_id}
        answer = self._answer = _Answer(event.request_id, event.item_id or self._new_item(), "audio" in event.modalities,
                                        metadata, event.in_conversation)
        self._last_response = answer.response_id
        response = rt.ResponseOut(
            id=answer.response_id, status="in_progress", conversation_id=self._conversation_id(answer),
            output_modalities=["audio"] if answer.audio else ["text"],
            max_output_tokens=self._max_output_tokens(), metadata=metadata,
        )
        item = answer.item("in_progress")
        out: list[rt.RealtimeServerEvent] = [
            rt.ResponseCreated(event_id=self._eid(), response=response),
            rt.OutputItemAdded(event_id=self._eid(), response_id=answer.response_id, item=item),
        ]
        if answer.in_conversation:
            out.append(rt.ConversationItemAdded(event_id=self._eid(), previous_item_id=event.previous_item_id, item=item))
        out.append(rt.ContentPartAdded(event_id=self._eid(), part=_empty_part(answer.audio), **answer.ids()))
        return out

    def _response_done(self, event: ResponseDone) -> list[rt.RealtimeServerEvent]:
        answer = self._answer
        assert answer is not None
        self._answer = None
        details: rt.StatusDetails
        if event.status == "completed" and event.finish_reason == "length":
            status, details = "incomplete", rt.StatusDetails(type="incomplete", reason="max_output_tokens")
        elif event.status == "completed":
            status, details = "completed", rt.StatusDetails(type="completed")
        elif event.status == "interrupted":
            reason = "turn_detected" if event.interrupted_by == "speech" else "client_cancelled"
            status, details = "cancelled", rt.StatusDetails(type="cancelled", reason=reason)
        else:
            status = "failed"
            details = rt.StatusDetails(
                type="failed", error=rt.StatusError(type="server_error", code=event.error_code or "engine_error")
            )
        item_status = "completed" if status == "completed" else "incomplete"
        item = answer.item(item_status)
        usage = event.usage
        response = rt.ResponseOut(
            id=answer.response_id, status=status, status_details=details, output=[item],
            conversation_id=self._conversation_id(answer), output_modalities=["audio"] if answer.audio else ["text"],
            max_output_tokens=self._max_output_tokens(), metadata=answer.metadata,
            usage=rt.Usage(
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                input_token_details=rt.InputTokenDetails(
                    cached_tokens=usage.cached_tokens, text_tokens=usage.text_tokens,
                    image_tokens=usage.image_tokens, audio_tokens=usage.audio_tokens,
                ),
                output_token_details=rt.OutputTokenDetails(text_tokens=usage.completion_tokens),
            ),
        )
        out: list[rt.RealtimeServerEvent] = [
            rt.ContentPartDone(event_id=self._eid(), part=answer.part(), **answer.ids()),
            rt.OutputItemDone(event_id=self._eid(), response_id=answer.response_id, item=item),
        ]
        if answer.in_conversation:
            out.append(rt.ConversationItemDone(event_id=self._eid(), item=item))
        return [*out, rt.ResponseDone(event_id=self._eid(), response=response)]

    def _error(self, event: ErrorEvent) -> rt.RealtimeError:
        origin = event.origin
        server_side = event.code in _SERVER_ERRORS
        code = event.wire_code or openai_code(event.code, origin.event_type if origin else None)
        return rt.RealtimeError(
            event_id=self._eid(),
            error=rt.ErrorDetail(
                type="server_error" if server_side else "invalid_request_error",
                code=code, message=event.message, event_id=origin.event_id if origin else None,
            ),
        )

    # ------------------------------------------------------------------ helpers
    def _added(
        self, item: rt.Item, previous: str | None, done_status: str = "completed"
    ) -> list[rt.RealtimeServerEvent]:
        """An item was added after ``previous`` (the core's: where it put it)."""
        done = item.model_copy(update={"status": done_status})
        return [
            rt.ConversationItemAdded(event_id=self._eid(), previous_item_id=previous, item=item),
            rt.ConversationItemDone(event_id=self._eid(), previous_item_id=previous, item=done),
        ]

    def _session(self) -> rt.SessionOut:
        config = self.config
        vad = config.get("turn_detection")
        return rt.SessionOut(
            id=self.session_id,
            model=str(config.get("model") or self.model or ""),
            instructions=config.get("system_prompt") or "",
            output_modalities=["audio"] if "audio" in config.get("modalities", ["text"]) else ["text"],
            max_output_tokens=self._max_output_tokens(),
            audio=rt.SessionAudioOut(
                input=rt.AudioInputOut(
                    format=self.in_format,
                    turn_detection=self._vad_out(vad),
                    transcription=self.transcription,
                    noise_reduction=self.noise_reduction,
                ),
                output=rt.AudioOutputOut(
                    format=self.out_format, voice=config.get("voice"), speed=config.get("speech_rate", 1.0)
                ),
            ),
            livesight={**{name: config.get(name) for name in _LIVESIGHT_FIELDS},
                       "notes": self.notes, "refused": self.refused, "ignored": self.ignored},
        )

    def _vad_out(self, vad: dict[str, Any] | None) -> rt.ServerVadOut | rt.SemanticVadOut | None:
        if vad is None:
            return None
        create, interrupt = vad.get("create_response", True), vad.get("interrupt_response", True)
        if self.vad_type == "semantic_vad":
            return rt.SemanticVadOut(eagerness=self.eagerness, create_response=create, interrupt_response=interrupt)
        return rt.ServerVadOut(
            threshold=vad["threshold"], prefix_padding_ms=vad["prefix_padding_ms"], silence_duration_ms=vad["silence_ms"],
            create_response=create, interrupt_response=interrupt, idle_timeout_ms=vad.get("idle_timeout_ms"),
        )

    def _max_output_tokens(self) -> int:
        return int(self.config.get("sampling", {}).get("max_tokens", 0)) or 1

    def _conversation_id(self, answer: _Answer | None = None) -> str | None:
        if answer is not None and not answer.in_conversation:
            return None  # out of band
        return f"conv_{self.session_id[5:]}"

    def _eid(self) -> str:
        return f"event_{next(self._event_ids)}"

    def _new_item(self) -> str:
        return f"item_{self.session_id[5:13]}_{next(self._item_ids)}"


def _max_tokens(value: int | str) -> int:
    """Realtime's ``"inf"`` is the most the server allows (the core lowers it to its limit)."""
    return 4096 if value == "inf" else max(1, int(value))


def _audio_item(item_id: str) -> rt.Item:
    return rt.Item(id=item_id, role="user", content=[rt.ItemContent(type="input_audio")])


def _empty_part(audio: bool) -> rt.ContentPartOut:
    return rt.ContentPartOut(type="audio", transcript="") if audio else rt.ContentPartOut(type="text", text="")


def _retrieved(event: ItemRetrieved) -> rt.Item:
    if event.role == "assistant":
        kind = "output_audio" if event.audio_ms is not None else "output_text"
        part = rt.ItemContent(type=kind, transcript=event.text or "") if kind == "output_audio" else \
            rt.ItemContent(type=kind, text=event.text or "")
        return rt.Item(id=event.item_id, role="assistant", content=[part])
    content = []
    if event.image is not None:
        content.append(rt.ItemContent(type="input_image", image_url=event.image))
    if event.text:
        content.append(rt.ItemContent(type="input_text", text=event.text))
    if event.audio_ms is not None:
        content.append(rt.ItemContent(type="input_audio"))
    return rt.Item(id=event.item_id, role=event.role, content=content)
