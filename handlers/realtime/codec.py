"""The Realtime codec: OpenAI Realtime messages <-> the session core's events.

It translates and keeps only what translation needs: the session's settings that the core
does not keep (``session_view.py``), the ids it gave to items, and the running response
(``handlers/wire/running_answer.py``). Frames, audio buffers, turns and answers are the
core's. Each direction is a table from an event's type to the function that translates it.

How core events show up:

- a camera frame is a user item with one ``input_image``: its ack becomes
  ``conversation.item.added`` + ``.done``; a frame the similarity filter drops is added,
  done with ``status: "incomplete"`` and deleted at once; a frame evicted from the buffer is
  ``conversation.item.deleted``. The conversation holds exactly the frames the model sees.
- an answer is one response with one assistant message item (``responses.py``).

Every error caused by a client event carries that event's ``event_id``, and OpenAI's code
where it has one for the problem (``errors.py``; the rest keep livesight's). A message the
JSON front end refuses (not JSON, ``NaN``, a lone surrogate, nested too deeply) is not read,
so its error names no event.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from handlers.realtime import client_events as rtc
from handlers.realtime import responses
from handlers.realtime import server_events as rt
from handlers.realtime.audio import audio_in, audio_out
from handlers.realtime.errors import realtime_error
from handlers.realtime.items import answer_request, audio_item, item_inputs, retrieved_item
from handlers.realtime.session_view import SessionView
from handlers.wire import commands as cmd
from handlers.core import events as ev
from handlers.wire.client_events import AudioChunkIn, MemoryClear, MemorySearch, SessionConfig, describe_validation_error
from handlers.wire.codec import CoreInput
from handlers.wire.errors import ErrorCode, Origin, SessionError
from handlers.wire.running_answer import AnswerTracker, RunningAnswer

log = logging.getLogger("livesight.realtime")

Out = list[rt.RealtimeServerEvent]


class RealtimeCodec:
    """One Realtime connection's translation (a ``WireCodec``)."""

    #: Audio becomes a question only when the client commits it (or server VAD ends it):
    #: without turn detection nothing is transcribed before the commit.
    commits_audio = True

    def __init__(self, model: str | None, max_message_bytes: int | None = None,
                 bound: dict[str, Any] | None = None) -> None:
        self.session = SessionView(model)
        #: The session config an ephemeral key carries: it wins over the client's updates.
        self._bound = rtc.RealtimeSession.model_validate(bound) if bound else None
        self._max_bytes = max_message_bytes  # the server's max_message_bytes (None: the transport's only)
        self._answers = AnswerTracker()
        self._event_ids = itertools.count(1)
        self._item_ids = itertools.count(1)
        self._speech_item: str | None = None  # the item of the speech being heard
        self._question_audio_item: str | None = None  # the audio item the next transcript belongs to

    # ------------------------------------------------------------------ connect
    def opening(self) -> list[CoreInput]:
        """A session starts configured (text answers, no turn detection): ``session.created`` goes out at once."""
        return [SessionConfig(model=self.session.model)]

    # ------------------------------------------------------------------ client -> core
    def decode(self, raw: str | bytes) -> list[CoreInput]:
        event, _ = rtc.parse_realtime_event(raw, max_bytes=self._max_bytes)  # its errors carry the event's origin
        assert event is not None
        origin = Origin(event.event_id, event.type)
        try:
            return [cmd.from_wire(core, origin) for core in _DECODERS[type(event)](self, event)]
        except SessionError as exc:
            exc.origin = origin
            raise
        except ValidationError as exc:  # a command out of the core's bounds (text too long, ...)
            error = SessionError(ErrorCode.INVALID_MESSAGE, f"{event.type}: {describe_validation_error(exc)}")
            error.origin = origin
            raise error from None

    def _session_update(self, event: rtc.SessionUpdate) -> list[CoreInput]:
        changes = self.session.changes(event.session)
        if self._bound is not None:
            changes.update(self.session.changes(self._bound))
        return [cmd.ConfigUpdate(changes=changes, refused=event._refused, ignored=event._ignored)]

    def _append(self, event: rtc.InputAudioBufferAppend) -> list[CoreInput]:
        return [AudioChunkIn(type="audio.chunk", data=audio_in(event.audio, self.session.in_format.type))]

    def _commit(self, event: rtc.InputAudioBufferCommit) -> list[CoreInput]:
        return [cmd.CommitAudio(item_id=self._new_item())]

    def _item_create(self, event: rtc.ConversationItemCreate) -> list[CoreInput]:
        return item_inputs(event.item, event.previous_item_id, self.session.in_format.type, self._new_item)

    def _response_create(self, event: rtc.ResponseCreate) -> list[CoreInput]:
        response = event.response or rtc.ResponseParams()
        output = response.audio.output if response.audio is not None else None
        if output is not None and output.format is not None:
            self.session.out_format = output.format
        return [answer_request(response)]

    # ------------------------------------------------------------------ core -> client
    def encode(self, event: ev.Event) -> list[str]:
        encoder = _ENCODERS.get(type(event))
        if encoder is None:
            return []  # events with no Realtime counterpart (frames consumed, pong, session done)
        return [rt.encode_realtime(out) for out in encoder(self, event)]

    def _ready(self, event: ev.SessionReady) -> Out:
        return [rt.SessionCreated(event_id=self._eid(), session=self.session.ready(event))]

    def _config_updated(self, event: ev.ConfigUpdated) -> Out:
        return [rt.SessionUpdated(event_id=self._eid(), session=self.session.updated(event))]

    def _frame(self, ack: ev.FrameAcked) -> Out:
        out: Out = []
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

    def _input_added(self, event: ev.InputAdded) -> Out:
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

    def _audio_committed(self, event: ev.AudioCommitted) -> Out:
        self._question_audio_item = event.item_id
        previous = event.previous_item_id
        committed = rt.AudioBufferCommitted(event_id=self._eid(), previous_item_id=previous, item_id=event.item_id)
        return [committed, *self._added(audio_item(event.item_id), previous)]

    def _audio_cleared(self, event: ev.AudioCleared) -> Out:
        return [rt.AudioBufferCleared(event_id=self._eid())]

    def _item_deleted(self, event: ev.ItemDeleted) -> Out:
        return [rt.ConversationItemDeleted(event_id=self._eid(), item_id=event.item_id)]

    def _item_retrieved(self, event: ev.ItemRetrieved) -> Out:
        return [rt.ConversationItemRetrieved(event_id=self._eid(), item=retrieved_item(event))]

    def _item_truncated(self, event: ev.ItemTruncated) -> Out:
        return [rt.ConversationItemTruncated(event_id=self._eid(), item_id=event.item_id,
                                             content_index=event.content_index, audio_end_ms=event.audio_end_ms)]

    def _idle_timeout(self, event: ev.IdleTimeout) -> Out:
        return [rt.TimeoutTriggered(event_id=self._eid(), item_id=event.item_id,
                                    audio_start_ms=int(event.audio_start_ms), audio_end_ms=int(event.audio_end_ms))]

    def _output_audio_cleared(self, event: ev.OutputAudioCleared) -> Out:
        response_id = self._answers.last_request_id or f"resp_{self.session.session_id[5:13]}_none"
        return [rt.OutputAudioBufferCleared(event_id=self._eid(), response_id=response_id)]

    def _speech_started(self, event: ev.SpeechBegan) -> Out:
        self._speech_item = event.item_id or self._new_item()
        return [rt.SpeechStarted(event_id=self._eid(), audio_start_ms=int(event.audio_start_ms), item_id=self._speech_item)]

    def _speech_stopped(self, event: ev.SpeechEnded) -> Out:
        item_id = event.item_id or self._speech_item or self._new_item()
        self._speech_item = None
        self._question_audio_item = item_id
        stopped = rt.SpeechStopped(event_id=self._eid(), audio_end_ms=int(event.audio_end_ms), item_id=item_id)
        previous = event.previous_item_id
        committed = rt.AudioBufferCommitted(event_id=self._eid(), previous_item_id=previous, item_id=item_id)
        return [stopped, committed, *self._added(audio_item(item_id), previous)]

    def _question_transcript(self, event: ev.QuestionTranscribed) -> Out:
        return self._transcribed(self._question_audio_item or self._new_item(), event.transcript, event.audio_ms)

    def _held_transcript(self, event: ev.InputTranscribed) -> Out:
        return self._transcribed(event.item_id, event.transcript, event.audio_ms)

    def _transcribed(self, item_id: str, transcript: str, audio_ms: float) -> Out:
        usage = rt.TranscriptionUsage(seconds=round(audio_ms / 1000, 3))
        return [rt.TranscriptionCompleted(event_id=self._eid(), item_id=item_id, transcript=transcript, usage=usage)]

    def _response_start(self, event: ev.AnswerStarted) -> Out:
        metadata = responses.response_metadata(event)
        answer = self._answers.start(event, event.item_id or self._new_item(), metadata)
        response = rt.ResponseOut(
            id=answer.request_id, status="in_progress",
            conversation_id=self.session.conversation_id(answer.in_conversation),
            output_modalities=responses.output_modalities(answer),
            max_output_tokens=self.session.max_output_tokens(), metadata=metadata,
        )
        item = responses.answer_item(answer, "in_progress")
        out: Out = [
            rt.ResponseCreated(event_id=self._eid(), response=response),
            rt.OutputItemAdded(event_id=self._eid(), response_id=answer.request_id, item=item),
        ]
        if answer.in_conversation:
            previous = event.previous_item_id
            out.append(rt.ConversationItemAdded(event_id=self._eid(), previous_item_id=previous, item=item))
        ids = responses.ids(answer)
        out.append(rt.ContentPartAdded(event_id=self._eid(), part=responses.empty_part(answer.speaks), **ids))
        return out

    def _text_delta(self, event: ev.AnswerTextDelta, answer: RunningAnswer) -> Out:
        answer.text += event.delta
        if answer.speaks:
            return [rt.OutputAudioTranscriptDelta(event_id=self._eid(), delta=event.delta, **responses.ids(answer))]
        return [rt.OutputTextDelta(event_id=self._eid(), delta=event.delta, **responses.ids(answer))]

    def _text_done(self, event: ev.AnswerTextDone, answer: RunningAnswer) -> Out:
        if answer.speaks:
            return [rt.OutputAudioTranscriptDone(event_id=self._eid(), transcript=event.text, **responses.ids(answer))]
        return [rt.OutputTextDone(event_id=self._eid(), text=event.text, **responses.ids(answer))]

    def _audio_delta(self, event: ev.AnswerAudioDelta, answer: RunningAnswer) -> Out:
        try:
            delta = audio_out(event.data, self.session.out_format.type)
        except ValueError as exc:
            log.warning("engine audio could not be converted: %s", exc)
            return []
        return [rt.OutputAudioDelta(event_id=self._eid(), delta=delta, **responses.ids(answer))]

    def _audio_done(self, event: ev.AnswerAudioDone, answer: RunningAnswer) -> Out:
        return [rt.OutputAudioDone(event_id=self._eid(), **responses.ids(answer))]

    def _response_done(self, event: ev.AnswerEnded, answer: RunningAnswer) -> Out:
        self._answers.finish()
        status, details = responses.end_status(event)
        item = responses.answer_item(answer, "completed" if status == "completed" else "incomplete")
        response = rt.ResponseOut(
            id=answer.request_id, status=status, status_details=details, output=[item],
            conversation_id=self.session.conversation_id(answer.in_conversation),
            output_modalities=responses.output_modalities(answer),
            max_output_tokens=self.session.max_output_tokens(), metadata=answer.metadata,
            usage=responses.usage(event.usage),
        )
        out: Out = [
            rt.ContentPartDone(event_id=self._eid(), part=responses.answer_part(answer), **responses.ids(answer)),
            rt.OutputItemDone(event_id=self._eid(), response_id=answer.request_id, item=item),
        ]
        if answer.in_conversation:
            out.append(rt.ConversationItemDone(event_id=self._eid(), item=item))
        return [*out, rt.ResponseDone(event_id=self._eid(), response=response)]

    def _error(self, event: ev.ErrorReported) -> Out:
        return [realtime_error(event, self._eid())]

    def _memory_progress(self, event: ev.MemoryProgress) -> Out:
        return [rt.LivesightMemoryProgress(event_id=self._eid(), **event.model_dump())]

    def _memory_results(self, event: ev.MemoryResults) -> Out:
        return [rt.LivesightMemoryResults(event_id=self._eid(), **event.model_dump())]

    def _memory_cleared(self, event: ev.MemoryCleared) -> Out:
        return [rt.LivesightMemoryCleared(event_id=self._eid(), deleted=event.deleted)]

    # ------------------------------------------------------------------ helpers
    def _added(self, item: rt.Item, previous: str | None, done_status: str = "completed") -> Out:
        """An item was added after ``previous`` (the core's: where it put it)."""
        done = item.model_copy(update={"status": done_status})
        return [
            rt.ConversationItemAdded(event_id=self._eid(), previous_item_id=previous, item=item),
            rt.ConversationItemDone(event_id=self._eid(), previous_item_id=previous, item=done),
        ]

    def _eid(self) -> str:
        return f"event_{next(self._event_ids)}"

    def _new_item(self) -> str:
        return f"item_{self.session.session_id[5:13]}_{next(self._item_ids)}"


def _in_answer(translate: Callable[[RealtimeCodec, Any, RunningAnswer], Out]) -> Callable[[RealtimeCodec, Any], Out]:
    """An encoder for an event of the running answer: none runs, nothing to send."""
    def encoder(codec: RealtimeCodec, event: Any) -> Out:
        answer = codec._answers.running
        return [] if answer is None else translate(codec, event, answer)

    return encoder


def _always(command: Callable[[], CoreInput]) -> Callable[[RealtimeCodec, Any], list[CoreInput]]:
    """A decoder for a client event that always means the same command."""
    return lambda codec, event: [command()]


#: Each client event's translation into core inputs.
_DECODERS: dict[type, Callable[[RealtimeCodec, Any], list[CoreInput]]] = {
    rtc.SessionUpdate: RealtimeCodec._session_update,
    rtc.InputAudioBufferAppend: RealtimeCodec._append,
    rtc.InputAudioBufferCommit: RealtimeCodec._commit,
    rtc.InputAudioBufferClear: _always(cmd.ClearAudio),
    rtc.ConversationItemCreate: RealtimeCodec._item_create,
    rtc.ConversationItemDelete: lambda codec, event: [cmd.DeleteItem(item_id=event.item_id)],
    rtc.ConversationItemRetrieve: lambda codec, event: [cmd.RetrieveItem(item_id=event.item_id)],
    rtc.ConversationItemTruncate: lambda codec, event: [cmd.TruncateItem(
        item_id=event.item_id, content_index=event.content_index, audio_end_ms=event.audio_end_ms)],
    rtc.OutputAudioBufferClear: _always(cmd.ClearOutputAudio),
    rtc.ResponseCreate: RealtimeCodec._response_create,
    rtc.ResponseCancel: _always(cmd.CancelRequest),
    rtc.LivesightMemorySearch: lambda codec, event: [MemorySearch(type="memory.search", **event.fields)],
    rtc.LivesightMemoryClear: lambda codec, event: [MemoryClear(type="memory.clear")],
}

#: Each core event's translation into Realtime events (a core event not here has none).
_ENCODERS: dict[type, Callable[[RealtimeCodec, Any], Out]] = {
    ev.SessionReady: RealtimeCodec._ready,
    ev.ConfigUpdated: RealtimeCodec._config_updated,
    ev.FrameAcked: RealtimeCodec._frame,
    ev.InputAdded: RealtimeCodec._input_added,
    ev.AudioCommitted: RealtimeCodec._audio_committed,
    ev.AudioCleared: RealtimeCodec._audio_cleared,
    ev.ItemDeleted: RealtimeCodec._item_deleted,
    ev.ItemRetrieved: RealtimeCodec._item_retrieved,
    ev.ItemTruncated: RealtimeCodec._item_truncated,
    ev.IdleTimeout: RealtimeCodec._idle_timeout,
    ev.OutputAudioCleared: RealtimeCodec._output_audio_cleared,
    ev.SpeechBegan: RealtimeCodec._speech_started,
    ev.SpeechEnded: RealtimeCodec._speech_stopped,
    ev.QuestionTranscribed: RealtimeCodec._question_transcript,
    ev.InputTranscribed: RealtimeCodec._held_transcript,
    ev.AnswerStarted: RealtimeCodec._response_start,
    ev.AnswerTextDelta: _in_answer(RealtimeCodec._text_delta),
    ev.AnswerTextDone: _in_answer(RealtimeCodec._text_done),
    ev.AnswerAudioDelta: _in_answer(RealtimeCodec._audio_delta),
    ev.AnswerAudioDone: _in_answer(RealtimeCodec._audio_done),
    ev.AnswerEnded: _in_answer(RealtimeCodec._response_done),
    ev.ErrorReported: RealtimeCodec._error,
    ev.MemoryProgress: RealtimeCodec._memory_progress,
    ev.MemoryResults: RealtimeCodec._memory_results,
    ev.MemoryCleared: RealtimeCodec._memory_cleared,
}
