"""/v1/realtime driven by the real openai SDK (``client.realtime.connect``) through the real app:
every server event must parse strictly into the SDK's own typed models."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, get_args

import pytest
from openai import AsyncOpenAI
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

from server.background import RunningServer, run_server
from server.bench.spoken import speak_clip
from server.client.connection import collect_until
from server.settings import Settings
from server.speech.wav import INPUT_RATE, OUTPUT_RATE, Pcm, resample
from handlers.wire.protocol import SERVER_TYPES, parse_server_event
from tests.protocol_client import b64, connect, jpeg_frame

pytestmark = pytest.mark.anyio

#: The SDK's model class for each server event type it knows.
SDK_MODELS = {
    get_args(cls.model_fields["type"].annotation)[0]: cls for cls in get_args(get_args(RealtimeServerEvent)[0])
}


def image_url(seed: int) -> str:
    return "data:image/jpeg;base64," + b64(jpeg_frame(seed))


class Conversation:
    """One SDK connection that checks every server event against the SDK's models."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[dict[str, Any]] = []

    async def recv(self, timeout: float = 120) -> dict[str, Any]:
        import anyio

        with anyio.fail_after(timeout):
            raw = await self.conn.recv_bytes()
        event = json.loads(raw)
        model = SDK_MODELS.get(event.get("type"))
        assert model is not None, f"the SDK knows no event {event.get('type')!r}"
        typed = model.model_validate(event)  # strict: required fields and their types
        assert type(self.conn.parse_event(raw)) is model
        assert not typed.model_extra, (event["type"], typed.model_extra)
        self.events.append(event)
        return event

    async def send_raw(self, text: str) -> None:
        """A message the SDK's typed senders would not build."""
        await self.conn._connection.send(text)

    async def until(self, kind: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Every event up to and including the first of type ``kind``."""
        return await collect_until(self.recv, lambda event: event["type"] == kind, timeout)

    async def add_image(self, seed: int, item_id: str | None = None) -> list[dict[str, Any]]:
        item: dict[str, Any] = {"type": "message", "role": "user",
                                "content": [{"type": "input_image", "image_url": image_url(seed)}]}
        if item_id:
            item["id"] = item_id
        await self.conn.conversation.item.create(item=item)
        return await self.until("conversation.item.done")

    async def ask(self, text: str | None = None, **response: Any) -> list[dict[str, Any]]:
        if text is not None:
            await self.conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
        await self.conn.response.create(response=response or None)
        return await self.until("response.done")


@asynccontextmanager
async def realtime(server: RunningServer, api_key: str = "unused", **query: Any) -> AsyncIterator[Conversation]:
    client = AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key=api_key, max_retries=0)
    async with client.realtime.connect(model="livesight", extra_query=query) as conn:
        conversation = Conversation(conn)
        created = await conversation.recv()
        assert created["type"] == "session.created"
        yield conversation


def heard(said: str, transcript: str) -> bool:
    """At least 40% of the words said are in the transcript. These tests pin the Realtime
    mapping (the transcript reaches its item); recognition accuracy is pinned by
    tests/socket/speech/test_voice_ws.py. PocketSphinx on a shared, warm server heard "what is on the table"
    as "what the article" once in CI."""
    words = transcript.split()
    return sum(w in words for w in said.split()) >= 0.4 * len(said.split())


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_image_items_then_a_typed_question_stream_text(server: RunningServer) -> None:
    """Frames as input_image items, then an input_text question: the answer streams as
    output_text deltas in one assistant item, response.done carries usage, and a follow-up
    reads the warm prefix (cached tokens)."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={"type": "realtime", "max_output_tokens": 12, "instructions": "Be brief."})
        updated = await rt.until("session.updated")
        assert updated[-1]["session"]["max_output_tokens"] == 12
        assert updated[-1]["session"]["instructions"] == "Be brief."
        for seed in range(3):
            added = await rt.add_image(seed, item_id=f"frame{seed}")
            assert kinds(added) == ["conversation.item.added", "conversation.item.done"]
            assert added[-1]["item"]["id"] == f"frame{seed}"
        events = await rt.ask("What do you see?")
        order = kinds(events)
        assert order[:2] == ["conversation.item.added", "conversation.item.done"]  # the question
        start = order.index("response.created")
        assert order[start : start + 4] == [
            "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added"
        ]
        assert order[-4:] == ["response.content_part.done", "response.output_item.done", "conversation.item.done",
                              "response.done"]
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        text_done = next(e for e in events if e["type"] == "response.output_text.done")
        assert deltas and "".join(deltas) == text_done["text"]
        response = events[-1]["response"]
        assert response["status"] in {"completed", "incomplete"}
        assert response["output"][0]["content"][0] == {"type": "output_text", "text": text_done["text"]}
        usage = response["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        follow_up = (await rt.ask("And now?"))[-1]["response"]["usage"]
        details = follow_up["input_token_details"]
        assert details["cached_tokens"] > 0 and details["image_tokens"] > 0 and details["audio_tokens"] == 0
        assert details["text_tokens"] + details["image_tokens"] + details["audio_tokens"] == follow_up["input_tokens"]
        assert follow_up["output_token_details"] == {"text_tokens": follow_up["output_tokens"], "audio_tokens": 0}


async def test_filtered_and_evicted_frames_leave_the_conversation(server: RunningServer) -> None:
    """livesight settings under session.livesight are applied and echoed; a near-duplicate
    frame is added, done incomplete and deleted; a frame evicted by max_frames is deleted."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={"type": "realtime", "livesight": {"max_frames": 2, "num_frames": 2}})
        session = (await rt.until("session.updated"))[-1]["session"]
        assert session["livesight"]["max_frames"] == 2 and session["livesight"]["prefix_warmup"] is True
        await rt.add_image(10, item_id="a")
        await rt.conn.conversation.item.create(item={"id": "a2", "type": "message", "role": "user",
                                                     "content": [{"type": "input_image", "image_url": image_url(10)}]})
        dup = await rt.until("conversation.item.deleted")
        assert kinds(dup) == ["conversation.item.added", "conversation.item.done", "conversation.item.deleted"]
        assert dup[1]["item"]["status"] == "incomplete" and dup[2]["item_id"] == "a2"
        await rt.add_image(11, item_id="b")
        await rt.conn.conversation.item.create(item={"id": "c", "type": "message", "role": "user",
                                                     "content": [{"type": "input_image", "image_url": image_url(12)}]})
        third = await rt.until("conversation.item.deleted")
        assert third[-1]["item_id"] == "a"
        await rt.conn.conversation.item.retrieve(item_id="a")
        assert (await rt.until("error"))[-1]["error"]["code"] == "item_retrieve_invalid_item_id"


async def test_cancel_ends_the_response_as_cancelled(server: RunningServer) -> None:
    """response.cancel during an answer: response.done with status cancelled, reason
    client_cancelled; the session goes on and answers the next question."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={"type": "realtime", "max_output_tokens": 400})
        await rt.until("session.updated")
        await rt.add_image(1)
        await rt.conn.response.create()
        await rt.until("response.output_text.delta")
        await rt.conn.response.cancel()
        done = (await rt.until("response.done"))[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        again = await rt.ask("Still there?", max_output_tokens=4)
        assert again[-1]["response"]["status"] in {"completed", "incomplete"}


async def test_audio_in_and_audio_out(server: RunningServer) -> None:
    """24 kHz PCM16 appended and committed is heard (transcribed) as the question; the answer
    is spoken: raw PCM16 output_audio deltas with no WAV header, and transcript deltas."""
    clip = speak_clip("what is on the table", noise=30, seed=1)
    pcm24 = resample(Pcm(clip.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    async with realtime(server) as rt:
        await rt.conn.session.update(
            session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 16,
                     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}}}
        )
        session = (await rt.until("session.updated"))[-1]["session"]
        assert session["output_modalities"] == ["audio"]
        await rt.add_image(2)
        step = 24_000 * 2 // 10  # 100 ms chunks
        for i in range(0, len(pcm24), step):
            await rt.conn.input_audio_buffer.append(audio=base64.b64encode(pcm24[i : i + step]).decode())
        await rt.conn.input_audio_buffer.commit()
        committed = await rt.until("conversation.item.done")
        assert kinds(committed) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
        audio_item = committed[0]["item_id"]
        events = await rt.ask()
        transcript = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert transcript["item_id"] == audio_item and heard(clip.text, transcript["transcript"])
        deltas = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
        assert deltas and all(not d.startswith(b"RIFF") and len(d) % 2 == 0 for d in deltas)
        assert sum(map(len, deltas)) > 24_000 * 2 * 0.2  # at least 0.2 s of speech
        spoken = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
        said = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
        assert spoken and "".join(spoken) == said
        order = kinds(events)
        assert order.index("response.output_audio.done") < order.index("response.done")
        assert events[-1]["response"]["output"][0]["content"][0]["type"] == "output_audio"


async def test_spoken_question_with_server_vad(server: RunningServer) -> None:
    """With server_vad, speech is found, committed as an item, transcribed and answered
    without response.create."""
    clip = speak_clip("how many people are in the room", noise=30, seed=1)
    pcm24 = resample(Pcm(clip.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    async with realtime(server) as rt:
        await rt.conn.session.update(session={
            "type": "realtime", "max_output_tokens": 8,
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}},
        })
        session = (await rt.until("session.updated"))[-1]["session"]
        assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
        await rt.add_image(4)
        step = 24_000 * 2 // 25  # 40 ms chunks
        for i in range(0, len(pcm24), step):
            await rt.conn.input_audio_buffer.append(audio=base64.b64encode(pcm24[i : i + step]).decode())
        events = await rt.until("response.done")
        order = kinds(events)
        assert order[:3] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "input_audio_buffer.committed"]
        item = events[0]["item_id"]
        assert events[1]["item_id"] == item == events[2]["item_id"]
        transcript = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert transcript["item_id"] == item and heard(clip.text, transcript["transcript"])
        assert events[-1]["response"]["status"] in {"completed", "incomplete"}
        usage = events[-1]["response"]["usage"]
        details = usage["input_token_details"]
        assert details["audio_tokens"] > 0 and details["image_tokens"] > 0  # the transcribed words
        assert details["text_tokens"] + details["image_tokens"] + details["audio_tokens"] == usage["input_tokens"]


async def test_speech_over_an_answer_cancels_it_as_turn_detected(server: RunningServer) -> None:
    """Barge-in: speech that starts during a spoken answer ends it with status cancelled,
    reason turn_detected; no audio of it follows its response.done."""
    clip = speak_clip("wait a moment", lead_ms=300, noise=30, seed=7)
    pcm24 = resample(Pcm(clip.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    async with realtime(server) as rt:
        await rt.conn.session.update(session={
            "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": "inf",
            "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
        })
        await rt.until("session.updated")
        await rt.add_image(3)
        await rt.conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Describe it all."}]}
        )
        await rt.conn.response.create()
        first = (await rt.until("response.output_audio.delta"))[-1]
        step = 24_000 * 2 // 25
        for i in range(0, len(pcm24), step):
            await rt.conn.input_audio_buffer.append(audio=base64.b64encode(pcm24[i : i + step]).decode())
        events = await rt.until("response.done")
        order = kinds(events)
        assert "input_audio_buffer.speech_started" in order
        done = events[-1]["response"]
        assert done["id"] == first["response_id"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
        later = await rt.until("response.done")  # the words spoken over it are the next question
        assert not [e for e in later if e["type"] == "response.output_audio.delta" and e["response_id"] == done["id"]]


async def send_speech(rt: Conversation, text: str, **clip: Any) -> str:
    """Append eSpeak NG speech of ``text`` as 24 kHz PCM16 in 40 ms chunks; returns what was said."""
    spoken = speak_clip(text, noise=30, **clip)
    pcm24 = resample(Pcm(spoken.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    step = 24_000 * 2 // 25
    for i in range(0, len(pcm24), step):
        await rt.conn.input_audio_buffer.append(audio=base64.b64encode(pcm24[i : i + step]).decode())
    return spoken.text


async def test_server_vad_without_create_response_waits_for_response_create(server: RunningServer) -> None:
    """turn_detection.create_response false: speech still gives speech_started, speech_stopped,
    committed, the user item and its transcription, but no response until response.create,
    which then answers it."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={
            "type": "realtime", "max_output_tokens": 6,
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400,
                                                   "create_response": False}}},
        })
        vad = (await rt.until("session.updated"))[-1]["session"]["audio"]["input"]["turn_detection"]
        assert vad["create_response"] is False and vad["interrupt_response"] is True
        await rt.add_image(5)
        said = await send_speech(rt, "what color is the car", seed=2)
        events = await rt.until("conversation.item.input_audio_transcription.completed")
        assert kinds(events) == [
            "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
            "conversation.item.added", "conversation.item.done",
            "conversation.item.input_audio_transcription.completed",
        ]
        item = events[0]["item_id"]
        assert {e.get("item_id", e.get("item", {}).get("id")) for e in events} == {item}
        assert heard(said, events[-1]["transcript"])
        await rt.conn.conversation.item.retrieve(item_id=item)  # answered in turn: no response came first
        retrieved = await rt.until("conversation.item.retrieved")
        assert kinds(retrieved) == ["conversation.item.retrieved"]
        assert retrieved[-1]["item"]["content"] == [{"type": "input_text", "text": events[-1]["transcript"]}]
        answer = await rt.ask()
        assert kinds(answer).count("response.created") == 1
        assert answer[-1]["response"]["status"] in {"completed", "incomplete"}
        assert answer[-1]["response"]["usage"]["input_token_details"]["audio_tokens"] > 0  # its words were spoken
        await rt.conn.conversation.item.retrieve(item_id=item)  # the question is in the timeline now
        retrieved = (await rt.until("conversation.item.retrieved"))[-1]["item"]
        assert retrieved["role"] == "user" and retrieved["content"][0]["text"] == events[-1]["transcript"]


async def test_server_vad_without_interrupt_response_lets_the_answer_go_on(server: RunningServer) -> None:
    """turn_detection.interrupt_response false: speech during an answer does not cancel it;
    the words are committed and transcribed as an item for the next response, and only the
    client's response.cancel ends the answer (reason client_cancelled)."""
    async with realtime(server) as rt:
        await rt.conn.session.update(session={
            "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": "inf",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400,
                                                   "interrupt_response": False}}},
        })
        await rt.until("session.updated")
        await rt.add_image(6)
        await rt.conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Describe it all."}]}
        )
        await rt.conn.response.create()
        first = (await rt.until("response.output_audio.delta"))[-1]
        said = await send_speech(rt, "how many people are in the room", lead_ms=300, seed=1)
        heard_events = await rt.until("conversation.item.input_audio_transcription.completed")
        order = kinds(heard_events)
        assert "response.done" not in order  # the answer went on through the speech
        assert order.index("input_audio_buffer.speech_started") < order.index("input_audio_buffer.committed")
        assert heard(said, heard_events[-1]["transcript"])
        await rt.conn.response.cancel()
        events = await rt.until("response.done")
        done = events[-1]["response"]
        assert done["id"] == first["response_id"] and "response.created" not in kinds(events)
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        answer = await rt.ask(max_output_tokens=4, output_modalities=["text"])  # answers the held words
        assert answer[-1]["response"]["status"] in {"completed", "incomplete"}


async def test_bad_events_get_realtime_errors_and_the_session_goes_on(server: RunningServer) -> None:
    """Invalid JSON, an unknown type, a missing field, an item that is not there and a non-data
    image URL each get an error event of the Realtime shape, with OpenAI's code where it has
    one and the failed event's event_id; the session then still answers."""
    async with realtime(server) as rt:
        await rt.send_raw("{not json")
        error = (await rt.until("error"))[-1]["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"
        await rt.send_raw(json.dumps({"type": "bogus.event", "event_id": "evt_1"}))
        error = (await rt.until("error"))[-1]["error"]
        assert error["code"] == "invalid_value" and error["event_id"] == "evt_1"
        await rt.send_raw(json.dumps({"type": "conversation.item.delete", "event_id": "evt_2"}))
        error = (await rt.until("error"))[-1]["error"]
        assert error["code"] == "missing_required_parameter" and error["event_id"] == "evt_2"
        assert "item_id" in error["message"]
        await rt.conn.conversation.item.delete(item_id="nope", event_id="evt_3")
        error = (await rt.until("error"))[-1]["error"]
        assert error["code"] == "item_delete_invalid_item_id" and error["event_id"] == "evt_3"
        await rt.conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.jpg"}]}
        )
        assert (await rt.until("error"))[-1]["error"]["code"] == "invalid_image"
        await rt.conn.response.create(event_id="evt_4")
        error = (await rt.until("error"))[-1]["error"]
        assert error["code"] == "no_frames" and error["event_id"] == "evt_4"
        await rt.add_image(7, item_id="img7")
        await rt.conn.conversation.item.retrieve(item_id="img7")
        item = (await rt.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["image_url"].startswith("data:image/jpeg;base64,")
        events = await rt.ask("Still fine?", max_output_tokens=3)
        assert events[-1]["response"]["status"] in {"completed", "incomplete"}
        await rt.conn.conversation.item.delete(item_id="img7")
        assert (await rt.until("conversation.item.deleted"))[-1]["item_id"] == "img7"


async def test_bearer_key_is_required_when_keys_are_set(tiny_model_dir: Path) -> None:
    """With api_keys set, the SDK's Bearer key opens a session, a wrong key is refused with an
    error event of the Realtime shape, and a browser's key subprotocol works."""
    import websockets

    settings = Settings(model=str(tiny_model_dir), api_keys=["sekret"])
    with run_server(settings) as server:
        async with realtime(server, api_key="sekret"):
            pass
        client = AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="wrong", max_retries=0)
        async with client.realtime.connect(model="livesight") as conn:
            event = json.loads(await conn.recv_bytes())
            assert event["type"] == "error" and event["error"]["code"] == "unauthorized"
            with pytest.raises(websockets.ConnectionClosed):
                await conn.recv_bytes()
        url = f"ws://{server.host}:{server.port}/v1/realtime?model=livesight"
        offered = ["realtime", "openai-insecure-api-key.sekret"]
        async with websockets.connect(url, subprotocols=offered) as ws:
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"


async def test_v1_endpoint_beside_it_sends_only_typed_v1_events(server: RunningServer) -> None:
    """/v1/video/chat/stream is unchanged: a session's every event parses with
    parse_server_event into a v1 type, and response.start carries only request_id (and a null
    trigger: no watch started it)."""
    client, ready = await connect(server, sampling={"max_tokens": 4})
    try:
        await client.frame(1, seed=1)
        events = await client.ask("What is it?")
        await client.send_raw("{bad")
        await client.recv_type("error")
        await client.send(type="ping")
        await client.recv_type("pong")
        await client.send(type="video.done")
        events += await client.collect_until("session.done")
        for event in [ready, *client.events]:
            typed = parse_server_event(json.dumps(event))
            assert typed.type == event["type"] and event["type"] in SERVER_TYPES
        start = next(e for e in events if e["type"] == "response.start")
        assert set(start) == {"type", "request_id", "trigger"} and start["trigger"] is None
    finally:
        await client.ws.close()


async def test_a_realtime_flood_is_rate_limited_like_any_session(server: RunningServer) -> None:
    """The control budget is the session's, not the codec's: 80 ``response.cancel`` events back
    to back (the answer budget's burst is 20) get ``rate_limited`` errors of the Realtime shape
    (naming the event dropped), a few, not one per event, and after a quiet second the session
    answers again."""
    async with realtime(server) as rt:
        for n in range(80):
            await rt.send_raw(json.dumps({"type": "response.cancel", "event_id": f"flood{n}"}))
        await rt.add_image(11, item_id="after-flood")  # read after every cancel: its items come last
        errors = [e["error"] for e in rt.events if e["type"] == "error"]
        limited = [e for e in errors if e["code"] == "rate_limited"]
        assert len(limited) == 1, errors  # one notice per episode
        assert limited[0]["type"] == "invalid_request_error" and limited[0]["event_id"].startswith("flood")
        assert {e["code"] for e in errors} <= {"rate_limited", "response_cancel_not_active"}
        import anyio

        await anyio.sleep(1.2)
        events = await rt.ask("Still there?", max_output_tokens=2)
        assert events[-1]["response"]["status"] in {"completed", "incomplete"}


async def test_idle_timeout_starts_a_response_after_a_silence(server: RunningServer) -> None:
    """server_vad idle_timeout_ms: after an answer, that much silence gives
    input_audio_buffer.timeout_triggered and a response by itself, once (not again after it)."""
    import anyio

    async with realtime(server) as rt:
        await rt.conn.session.update(session={
            "type": "realtime", "max_output_tokens": 4,
            "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}},
        })
        vad = (await rt.until("session.updated"))[-1]["session"]["audio"]["input"]["turn_detection"]
        assert vad["idle_timeout_ms"] == 5000
        await rt.add_image(8)
        await rt.ask("What is it?")
        started = anyio.current_time()
        events = await rt.until("response.done", timeout=30)
        assert anyio.current_time() - started >= 4.5
        order = kinds(events)
        assert order[0] == "input_audio_buffer.timeout_triggered" and "response.created" in order
        assert events[-1]["response"]["status"] in {"completed", "incomplete"}
        with anyio.move_on_after(6.5):
            await rt.until("response.created", timeout=7)
            raise AssertionError("a second silence answer")


async def test_low_detail_images_cost_fewer_tokens(server: RunningServer) -> None:
    """input_image.detail low sends the picture smaller: a question over it has fewer image
    tokens than over the same picture at high (auto is high)."""
    tokens = {}
    for detail in ("low", "high"):
        async with realtime(server) as rt:
            await rt.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/jpeg;base64," + b64(jpeg_frame(30, size=(640, 480))),
                 "detail": detail}]})
            await rt.until("conversation.item.done")
            events = await rt.ask("What is it?", max_output_tokens=2)
            tokens[detail] = events[-1]["response"]["usage"]["input_token_details"]["image_tokens"]
    assert 0 < tokens["low"] < tokens["high"]


async def test_one_response_at_a_time_as_openai_runs_them(server: RunningServer) -> None:
    """A response.create while a response runs is refused with
    conversation_already_has_active_response (naming it) and the running one goes on to its
    end; a response.cancel with none running gets response_cancel_not_active; a
    response.create right after a cancel is answered."""
    async with realtime(server) as rt:
        await rt.add_image(9)
        await rt.conn.response.create(response={"max_output_tokens": 200})
        first = (await rt.until("response.created"))[-1]["response"]["id"]
        await rt.conn.response.create(event_id="second")
        refused = (await rt.until("error"))[-1]["error"]
        assert refused["code"] == "conversation_already_has_active_response" and refused["event_id"] == "second"
        events = await rt.until("response.done")
        assert events[-1]["response"]["id"] == first and "response.created" not in kinds(events)
        await rt.conn.response.cancel(event_id="idle-cancel")
        error = (await rt.until("error"))[-1]["error"]
        assert error["code"] == "response_cancel_not_active" and error["event_id"] == "idle-cancel"
        await rt.conn.response.create(response={"max_output_tokens": 200})
        await rt.until("response.output_text.delta")
        await rt.conn.response.cancel()
        await rt.conn.response.create(response={"max_output_tokens": 3})
        events = await rt.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        events = await rt.until("response.done")
        assert events[-1]["response"]["status"] in {"completed", "incomplete"}
        assert "error" not in kinds(events)
