"""Pipecat's ``OpenAIRealtimeLLMService`` against /v1/realtime, unchanged: a pipeline of the service
and a collector, with no transport, over a real socket to the real app and tiny engine. Pipecat
stops reading at a server ``error`` (but for a few codes), so every scenario must get none."""

from __future__ import annotations

import io
from typing import Any

import anyio
import pytest
from PIL import Image

from server.background import RunningServer
from tests.protocol_client import jpeg_frame

from pipecat.frames.frames import (  # noqa: E402
    ErrorFrame,
    Frame,
    InputImageRawFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
from pipecat.pipeline.task import PipelineParams, PipelineTask  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime import events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402

pytestmark = pytest.mark.anyio


class Collector(FrameProcessor):
    """Keeps every frame that reaches the end of the pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)

    def of(self, kind: type) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]

    async def wait(self, kind: type, count: int = 1, timeout: float = 120) -> list[Any]:
        with anyio.fail_after(timeout):
            while len(self.of(kind)) < count:
                await anyio.sleep(0.05)
        return self.of(kind)


def image_frame(seed: int) -> InputImageRawFrame:
    image = Image.open(io.BytesIO(jpeg_frame(seed))).convert("RGB")
    return InputImageRawFrame(image=image.tobytes(), size=image.size, format="RGB")


def realtime_service(server: RunningServer, **session: Any) -> OpenAIRealtimeLLMService:
    """Pipecat's Realtime service on the server, with no turn detection and ``session``'s properties."""
    return OpenAIRealtimeLLMService(
        api_key="unused", base_url=f"ws://{server.host}:{server.port}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(session_properties=events.SessionProperties(
            audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=False)), **session,
        )),
    )


async def start_with_a_frame(tg: Any, task: PipelineTask, llm: OpenAIRealtimeLLMService, seed: int) -> None:
    """Run the pipeline in ``tg``, wait for the session, then send one camera frame."""
    tg.start_soon(PipelineRunner(handle_sigint=False).run, task)
    with anyio.fail_after(30):
        while not llm._api_session_ready:
            await anyio.sleep(0.05)
    await task.queue_frame(image_frame(seed))
    await anyio.sleep(0.5)  # the frame is taken before the question


async def test_a_camera_frame_then_seeded_history_and_a_question_stream_text(server: RunningServer) -> None:
    """Text out, no turn detection: a camera frame, then a context of a system message and
    user and assistant messages closing on a question: the answer streams as LLM text frames
    and ends, its item is retrieved as the assistant's with that text, and no error frame
    comes (Pipecat would stop reading at one, and refused assistant items were one)."""
    llm = realtime_service(server, output_modalities=["text"], max_output_tokens=32)
    created: list[tuple[str, str]] = []

    @llm.event_handler("on_conversation_item_created")
    async def on_item(service: Any, item_id: str, item: Any) -> None:
        created.append((item_id, item.role))

    collector, upstream = Collector(), Collector()  # upstream: what the service pushes back (its errors)
    task = PipelineTask(Pipeline([upstream, llm, collector]), params=PipelineParams(), idle_timeout_secs=None)
    context = LLMContext(messages=[
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Is it day?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "What do you see?"},
    ])
    async with anyio.create_task_group() as tg:
        await start_with_a_frame(tg, task, llm, 1)
        await task.queue_frame(LLMContextFrame(context))
        await collector.wait(LLMFullResponseEndFrame)
        answer = next(item_id for item_id, role in created if role == "assistant")  # the server's own
        with anyio.fail_after(30):
            item = await llm.retrieve_conversation_item(answer)
        await task.cancel()
    text = "".join(f.text for f in collector.of(LLMTextFrame))
    assert text and item.role == "assistant" and item.content[0].text == text
    assert not collector.of(ErrorFrame) and not upstream.of(ErrorFrame), upstream.of(ErrorFrame)


async def test_the_user_talks_over_a_spoken_answer_and_asks_again(server: RunningServer) -> None:
    """Audio out, no turn detection: while the answer plays the user starts talking
    (InterruptionFrame): Pipecat cancels it and truncates its item at what was played; the
    item then holds only those words; the spoken question that follows (committed at
    UserStoppedSpeakingFrame) is answered with audio, and no error comes."""
    from pipecat.frames.frames import InputAudioRawFrame, InterruptionFrame, TTSAudioRawFrame, UserStoppedSpeakingFrame

    from server.bench.spoken import speak_clip
    from server.speech.wav import INPUT_RATE, OUTPUT_RATE, Pcm, resample

    llm = realtime_service(server, output_modalities=["audio"], max_output_tokens=48)
    assistant_items: list[str] = []

    @llm.event_handler("on_conversation_item_created")
    async def on_item(service: Any, item_id: str, item: Any) -> None:
        if item.role == "assistant":
            assistant_items.append(item_id)

    collector, upstream = Collector(), Collector()  # upstream: what the service pushes back (its errors)
    task = PipelineTask(Pipeline([upstream, llm, collector]), params=PipelineParams(), idle_timeout_secs=None)
    clip = speak_clip("what is on the table", noise=30, seed=1)
    pcm24 = resample(Pcm(clip.pcm16, INPUT_RATE), OUTPUT_RATE).samples
    step = OUTPUT_RATE * 2 // 50  # 20 ms
    async with anyio.create_task_group() as tg:
        await start_with_a_frame(tg, task, llm, 2)
        await task.queue_frame(LLMContextFrame(LLMContext(messages=[{"role": "user", "content": "Describe it all."}])))
        await collector.wait(TTSAudioRawFrame)
        await anyio.sleep(0.4)  # some of it has played
        await task.queue_frame(InterruptionFrame())
        cut = len(collector.frames)
        for i in range(0, len(pcm24), step):
            await task.queue_frame(InputAudioRawFrame(audio=pcm24[i : i + step], sample_rate=OUTPUT_RATE, num_channels=1))
        await task.queue_frame(UserStoppedSpeakingFrame())
        with anyio.fail_after(120):
            while not any(isinstance(f, TTSAudioRawFrame) for f in collector.frames[cut:]):
                await anyio.sleep(0.05)
        with anyio.fail_after(30):
            first = await llm.retrieve_conversation_item(assistant_items[0])
        await collector.wait(LLMFullResponseEndFrame, 2)
        await task.cancel()
    heard = first.content[0].transcript or ""
    said = "".join(f.text for f in collector.frames[:cut] if isinstance(f, LLMTextFrame))
    assert len(assistant_items) >= 2
    assert len(heard.split()) < len(said.split()) and "[interrupted]" not in heard  # cut to what played
    assert all(word in said for word in heard.split())
    assert not collector.of(ErrorFrame) and not upstream.of(ErrorFrame), upstream.of(ErrorFrame)
