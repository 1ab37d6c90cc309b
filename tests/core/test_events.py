"""The core's events and how protocol v1 carries them: one v1 message per event that has one,
built from the event's fields, the JSON as v1 has always sent it."""

from __future__ import annotations

import inspect
import json

from handlers.core import events as ev
from handlers.wire.codec import V1_MESSAGES, V1Codec
from handlers.wire.errors import Origin
from handlers.wire.protocol import SERVER_TYPES

#: The core's events that v1 has no message for (the conversation's items, a codec's edits).
NOT_ON_V1 = {ev.ConfigUpdated, ev.InputAdded, ev.AudioCommitted, ev.InputTranscribed, ev.AudioCleared, ev.ItemDeleted,
             ev.ItemRetrieved, ev.ItemTruncated, ev.IdleTimeout, ev.OutputAudioCleared}


def _events() -> set[type]:
    return {c for _, c in inspect.getmembers(ev, inspect.isclass) if issubclass(c, ev.Event) and c is not ev.Event}


def test_every_event_has_one_v1_message_or_none_on_purpose() -> None:
    """Each core event maps to a v1 model or is listed as having none; every v1 server message comes from one event."""
    assert set(V1_MESSAGES) | NOT_ON_V1 == _events() and not set(V1_MESSAGES) & NOT_ON_V1
    v1_types = [model.model_fields["type"].default for model in V1_MESSAGES.values()]
    assert sorted(v1_types) == sorted(SERVER_TYPES)


def test_events_v1_has_no_message_for_send_nothing() -> None:
    """An item's edit or a held turn's words send nothing on v1."""
    codec = V1Codec()
    assert codec.encode(ev.ItemTruncated(item_id="i", content_index=0, audio_end_ms=5)) == []
    assert codec.encode(ev.InputTranscribed(item_id="i", transcript="hi", audio_ms=3)) == []


def test_v1_carries_the_events_fields_and_leaves_out_what_it_has_no_room_for() -> None:
    """v1's JSON keeps its field order and numbers as floats, and drops items, modalities and an error's origin."""
    codec = V1Codec()
    ack = ev.FrameAcked(frame_id=3, accepted=True, buffered_frames=2, server_receive_ts_ms=17, previous_item_id="p")
    assert codec.encode(ack) == ['{"type":"video.frame.ack","frame_id":3,"pts_ms":null,"capture_ts_ms":null,'
                                 '"accepted":true,"buffered_frames":2,"server_receive_ts_ms":17.0,"reason":null,'
                                 '"similarity":null,"dropped_frame_id":null,"dropped_frame_ids":[]}']
    start = ev.AnswerStarted(request_id="r", trigger=ev.WatchTrigger(watch_id="w"), modalities=["audio"], item_id="i",
                             metadata={"k": "v"}, in_conversation=False, previous_item_id="p")
    assert codec.encode(start) == ['{"type":"response.start","request_id":"r",'
                                   '"trigger":{"type":"watch","watch_id":"w"}}']
    end = ev.AnswerEnded(request_id="r", status="completed", usage=ev.Usage(prompt_tokens=9, image_tokens=4),
                         timings=ev.Timings(total_ms=3))
    assert json.loads(codec.encode(end)[0])["usage"] == {"prompt_tokens": 9, "cached_tokens": 0, "completion_tokens": 0,
                                                         "image_tokens": 4, "audio_tokens": 0, "text_tokens": 5}
    error = ev.ErrorReported(code="c", message="m", origin=Origin("e1", "x.y"), wire_code="w")
    assert codec.encode(error) == ['{"type":"error","code":"c","message":"m","frame_id":null,"closes_session":false,'
                                   '"retry_after_ms":null}']
