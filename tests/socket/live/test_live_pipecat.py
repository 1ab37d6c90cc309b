"""Pipecat's ``GeminiLiveLLMService`` against the Gemini Live endpoint, unchanged but for its
``http_options`` base URL: a pipeline of the service and a collector, with no transport, over
TLS to the real app and tiny engine. What Pipecat sends (its setup with history, transcription
and resumption configs, its context as clientContent, camera frames) must be taken."""

from __future__ import annotations

import anyio
import pytest

from server.background import RunningServer
from tests.socket.live.conftest import API_KEY

from google.genai.types import HttpOptions
from pipecat.frames.frames import ErrorFrame, LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService, GeminiModalities

from tests.socket.realtime.test_pipecat import Collector, image_frame  # the same pipeline end, camera frames

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("trust_live_tls")]


async def test_a_context_then_a_camera_frame_and_a_typed_question_stream_text(live_server: RunningServer) -> None:
    """Text out: Pipecat's setup is taken; its context (user and assistant messages) seeds the
    conversation as clientContent; a camera frame and a typed question (realtimeInput.text)
    are answered as LLM text frames to the response's end, and no error frame comes."""
    from pipecat.frames.frames import InputTextRawFrame

    llm = GeminiLiveLLMService(
        api_key=API_KEY,
        http_options=HttpOptions(base_url=f"https://{live_server.host}:{live_server.port}"),
        settings=GeminiLiveLLMService.Settings(modalities=GeminiModalities.TEXT, max_tokens=16, temperature=0.0),
        inference_on_context_initialization=False,
    )
    collector = Collector()
    task = PipelineTask(Pipeline([llm, collector]), params=PipelineParams(), idle_timeout_secs=None)
    context = LLMContext(messages=[{"role": "user", "content": "Is it day?"}, {"role": "assistant", "content": "Yes."}])
    async with anyio.create_task_group() as tg:
        tg.start_soon(PipelineRunner(handle_sigint=False).run, task)
        await task.queue_frame(LLMContextFrame(context))
        with anyio.fail_after(30):
            while not llm._ready_for_realtime_input:
                await anyio.sleep(0.05)
        await task.queue_frame(image_frame(1))
        await anyio.sleep(0.5)
        await task.queue_frame(InputTextRawFrame(text="What do you see?"))
        await collector.wait(LLMFullResponseEndFrame)
        await task.cancel()
    assert not collector.of(ErrorFrame), collector.of(ErrorFrame)
    assert "".join(f.text for f in collector.of(LLMTextFrame))
