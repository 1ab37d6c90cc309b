"""LiveKit Agents' OpenAI Realtime model (livekit-plugins-openai) against /v1/realtime, unchanged:
``RealtimeModel(base_url=...).session()`` over a real socket to the real app and tiny engine, no
LiveKit server or WebRTC. Every server event the plugin receives is kept; none is an ``error``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest
from PIL import Image

from server.background import RunningServer
from server.bench.spoken import speak_clip
from server.speech.wav import INPUT_RATE, OUTPUT_RATE, Pcm, resample
from tests.protocol_client import jpeg_frame

import livekit.agents.llm as lk_llm  # noqa: E402  (the test extra pins livekit-agents: no skip)
import livekit.plugins.openai as lk_openai  # noqa: E402
from livekit import rtc  # noqa: E402

pytestmark = pytest.mark.anyio


def video_frame(seed: int) -> Any:
    """A camera frame as LiveKit gives it to ``push_video`` (RGBA)."""
    import io

    image = Image.open(io.BytesIO(jpeg_frame(seed))).convert("RGBA")
    return rtc.VideoFrame(image.width, image.height, rtc.VideoBufferType.RGBA, image.tobytes())


class Events:
    """Every server event the plugin received, as JSON objects."""

    def __init__(self) -> None:
        self.all: list[dict[str, Any]] = []

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.all if e.get("type") == kind]

    async def wait(self, kind: str, count: int = 1, timeout: float = 120) -> list[dict[str, Any]]:
        with anyio.fail_after(timeout):
            while len(self.of(kind)) < count:
                await anyio.sleep(0.05)
        return self.of(kind)


@asynccontextmanager
async def livekit_session(
    server: RunningServer, max_tokens: int | None = None, **options: Any
) -> AsyncIterator[tuple[Any, Events]]:
    """A LiveKit realtime session on the server; ``options`` go to ``RealtimeModel``, and
    ``max_tokens`` to its ``max_response_output_tokens`` (LiveKit's default: ``"inf"``)."""
    import asyncio

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def ignore_cut_answers(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # The tiny random-weight model never ends by itself: its answers stop at the token limit
        # (response.done "incomplete"), and LiveKit fails the generation's private done future
        # with it, which nothing awaits without an agent.
        if str(context.get("exception", "")).startswith("response incomplete: max_output_tokens"):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    loop.set_exception_handler(ignore_cut_answers)
    model = lk_openai.realtime.RealtimeModel(base_url=f"{server.http_url}/v1", api_key="unused", **options)
    if max_tokens is not None:
        model.update_options(max_response_output_tokens=max_tokens)
    session = model.session()
    events = Events()
    session.on("openai_server_event_received", events.all.append)
    try:
        await events.wait("session.updated")
        yield session, events
        assert not events.of("error"), events.of("error")
    finally:
        await session.aclose()
        await model.aclose()
        loop.set_exception_handler(previous)


async def answer_text(generation: Any) -> tuple[str, int]:
    """The text of a generation's first message, and how many audio frames came with it."""
    frames = 0
    text = ""
    async for message in generation.message_stream:
        async with anyio.create_task_group() as tg:
            async def count_audio() -> None:
                nonlocal frames
                async for _ in message.audio_stream:
                    frames += 1

            tg.start_soon(count_audio)
            async for piece in message.text_stream:
                text += str(piece)
        break
    return text, frames


def chat(session: Any, *turns: tuple[str, str]) -> Any:
    """The session's conversation (frames included, as LiveKit keeps it) with ``turns`` added."""
    ctx = session.chat_ctx.copy()
    for role, text in turns:
        ctx.add_message(role=role, content=text)
    return ctx


async def test_frames_then_a_question_generate_reply_returns_streamed_text(server: RunningServer) -> None:
    """Text modality: frames pushed with push_video, a question added with update_chat_ctx,
    then generate_reply() resolves (response.metadata echoed) and its text streams."""
    async with livekit_session(server, 24, modalities=["text"], turn_detection=None) as (session, events):
        for seed in range(3):
            session.push_video(video_frame(seed))
        await events.wait("conversation.item.done", 3)
        await session.update_chat_ctx(chat(session, ("user", "What do you see?")))
        with anyio.fail_after(60):
            generation = await session.generate_reply()
        text, _ = await answer_text(generation)
        done = (await events.wait("response.done"))[-1]["response"]
        assert text and done["output"][0]["content"][0]["text"] == text
        assert done["metadata"]["client_event_id"].startswith("response_create_")
        assert events.of("response.created")[-1]["response"]["metadata"] == done["metadata"]


async def test_seeded_history_with_assistant_messages_is_answered_in_context(server: RunningServer) -> None:
    """update_chat_ctx with user and assistant messages (created from root, one after the
    other) returns; they are in the conversation in order, as what they are, and the next
    question's prompt holds them (more input tokens than the same question without them)."""
    async with livekit_session(server, 24, modalities=["text"], turn_detection=None) as (session, events):
        session.push_video(video_frame(1))
        await events.wait("conversation.item.done")
        await session.update_chat_ctx(chat(session, ("user", "Say no."), ("assistant", "No."), ("user", "What is it?")))
        with anyio.fail_after(60):
            await answer_text(await session.generate_reply())
        seeded = (await events.wait("response.done"))[-1]["response"]["usage"]["input_tokens"]
        added = [e["item"]["role"] for e in events.of("conversation.item.added")]
        assert added[:4] == ["user", "user", "assistant", "user"]  # the frame, then the history
        assert events.of("conversation.item.added")[2]["item"]["content"][0]["type"] == "output_text"
    async with livekit_session(server, 24, modalities=["text"], turn_detection=None) as (session, events):
        session.push_video(video_frame(1))
        await events.wait("conversation.item.done")
        await session.update_chat_ctx(chat(session, ("user", "What is it?")))
        with anyio.fail_after(60):
            await answer_text(await session.generate_reply())
        plain = (await events.wait("response.done"))[-1]["response"]["usage"]["input_tokens"]
    assert seeded > plain


async def test_defaults_semantic_vad_audio_out_and_a_spoken_question(server: RunningServer) -> None:
    """All of LiveKit's defaults (semantic_vad, audio out, input transcription): the session
    is updated with them, a spoken question (eSpeak NG) is heard, transcribed and answered
    with audio and its transcript."""
    clip = speak_clip("what is on the table", noise=30, seed=1)
    pcm24 = resample(Pcm(clip.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    async with livekit_session(server) as (session, events):
        vad = events.of("session.updated")[-1]["session"]["audio"]["input"]["turn_detection"]
        assert vad["type"] == "semantic_vad"
        assert events.of("session.updated")[-1]["session"]["output_modalities"] == ["audio"]
        generations: list[Any] = []
        session.on("generation_created", generations.append)
        session.push_video(video_frame(2))
        await events.wait("conversation.item.done")
        step = OUTPUT_RATE // 50  # 20 ms frames, as a room track gives them
        samples = np.frombuffer(pcm24, "<i2")
        for i in range(0, len(samples), step):
            chunk = samples[i : i + step]
            session.push_audio(rtc.AudioFrame(chunk.tobytes(), OUTPUT_RATE, 1, len(chunk)))
            await anyio.sleep(0)
        transcript = (await events.wait("conversation.item.input_audio_transcription.completed"))[-1]["transcript"]
        assert transcript
        await events.wait("response.created")
        assert generations
        text, audio_frames = await answer_text(generations[0])
        done = (await events.wait("response.done"))[-1]["response"]
        assert done["status"] in {"completed", "incomplete"} and text and audio_frames > 0
        assert events.of("response.output_audio.delta")


async def _answer_then_follow_up(server: RunningServer, played_ms: int | None) -> tuple[str, str, int]:
    """Audio out, no turn detection: a question over a frame; when ``played_ms`` is given the
    user cuts in after that much of the answer was played (LiveKit truncates the item there);
    then a follow-up. Returns the answer's transcript, what the conversation keeps of it, and
    the follow-up's input tokens."""
    async with livekit_session(server, 48, modalities=["audio"], turn_detection=None) as (session, events):
        session.push_video(video_frame(3))
        await events.wait("conversation.item.done")
        await session.update_chat_ctx(chat(session, ("user", "Describe everything.")))
        with anyio.fail_after(120):
            generation = await session.generate_reply()
            full, _ = await answer_text(generation)
        item_id = (await events.wait("response.done"))[-1]["response"]["output"][0]["id"]
        if played_ms is not None:  # the audio came faster than it played: the user talks over it
            session.truncate(message_id=item_id, modalities=["audio"], audio_end_ms=played_ms)
            truncated = (await events.wait("conversation.item.truncated"))[-1]
            assert truncated["item_id"] == item_id and truncated["audio_end_ms"] == played_ms
        session.send_event({"type": "conversation.item.retrieve", "item_id": item_id, "event_id": "rci_check"})
        kept = (await events.wait("conversation.item.retrieved"))[-1]["item"]["content"][0]["transcript"]
        await session.update_chat_ctx(chat(session, ("user", "And then?")))
        with anyio.fail_after(120):
            await answer_text(await session.generate_reply())
        follow_up = (await events.wait("response.done", 2))[-1]["response"]["usage"]["input_tokens"]
        return full, kept, follow_up


async def test_talking_over_the_answer_truncates_it_to_what_was_heard(server: RunningServer) -> None:
    """The user cuts in 300 ms into a spoken answer: LiveKit truncates the item there
    (conversation.item.truncated), the item keeps only the words heard by then, and the next
    question is answered over a prompt that holds only them: fewer input tokens than the same
    conversation (greedy, so the same answer) kept whole."""
    full, heard, truncated_tokens = await _answer_then_follow_up(server, 300)
    whole, kept, whole_tokens = await _answer_then_follow_up(server, None)
    assert full == whole and kept == whole  # the same answer; untouched, it is kept whole
    assert len(heard.split()) < len(full.split()) and full.split()[: len(heard.split())] == heard.split()
    assert truncated_tokens < whole_tokens


async def test_cutting_in_before_any_audio_played_deletes_the_answer(server: RunningServer) -> None:
    """The user cuts in before any of the answer played: LiveKit cancels the response and
    deletes its item (truncate at 0 ms is a delete); the server deletes the item it made
    (conversation.item.deleted, no error), and the next reply is answered."""
    async with livekit_session(server, 48, modalities=["audio"], turn_detection=None) as (session, events):
        session.push_video(video_frame(4))
        await events.wait("conversation.item.done")
        await session.update_chat_ctx(chat(session, ("user", "Describe everything.")))
        with anyio.fail_after(60):
            await session.generate_reply()
        item_id = (await events.wait("response.output_item.added"))[-1]["item"]["id"]
        session.interrupt()
        session.truncate(message_id=item_id, modalities=["audio"], audio_end_ms=0)
        deleted = await events.wait("conversation.item.deleted")
        assert item_id in [e["item_id"] for e in deleted]
        await events.wait("response.done")
        await session.update_chat_ctx(chat(session, ("user", "And now?")))
        with anyio.fail_after(120):
            await answer_text(await session.generate_reply())
        assert (await events.wait("response.done", 2))[-1]["response"]["status"] in {"completed", "incomplete"}
