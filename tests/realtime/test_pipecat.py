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

pytest.importorskip("pipecat")
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


async def test_a_camera_frame_then_seeded_history_and_a_question_stream_text(server: RunningServer) -> None:
    """Text out, no turn detection: a camera frame, then a context of a system message and
    user and assistant messages closing on a question: the answer streams as LLM text frames
    and ends, and no error frame comes (Pipecat would stop reading at one)."""
    llm = OpenAIRealtimeLLMService(
        api_key="unused", base_url=f"ws://{server.host}:{server.port}/v1/realtime",
        session_properties=events.SessionProperties(
            output_modalities=["text"], audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=False)),
        ),
    )
    collector = Collector()
    task = PipelineTask(Pipeline([llm, collector]), params=PipelineParams(), idle_timeout_secs=None)
    context = LLMContext(messages=[
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Is it day?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "What do you see?"},
    ])
    async with anyio.create_task_group() as tg:
        tg.start_soon(PipelineRunner(handle_sigint=False).run, task)
        with anyio.fail_after(30):
            while not llm._api_session_ready:
                await anyio.sleep(0.05)
        await task.queue_frame(image_frame(1))
        await anyio.sleep(0.5)
        await task.queue_frame(LLMContextFrame(context))
        await collector.wait(LLMFullResponseEndFrame)
        await task.cancel()
    assert "".join(f.text for f in collector.of(LLMTextFrame))
    assert not collector.of(ErrorFrame), collector.of(ErrorFrame)
