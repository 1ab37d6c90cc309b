"""An answer as a Realtime response: one response with one assistant message item and one
content part (``text``, or ``audio`` with its transcript). The item's id is the core's (the
core deletes, retrieves and truncates it), and the client's ``metadata`` comes back with it.

Why an answer ended comes with its ``response.done``: ``cancelled`` with ``turn_detected``
when speech interrupted it, ``client_cancelled`` otherwise; ``incomplete`` with
``max_output_tokens`` when it ran out of tokens; ``failed`` with the error's code.
"""

from __future__ import annotations

from typing import Any

from handlers.core.events import AnswerEnded, AnswerStarted, Usage
from handlers.realtime import server_events as rt
from handlers.wire.running_answer import RunningAnswer


def ids(answer: RunningAnswer) -> dict[str, Any]:
    """The ids every event inside a response carries."""
    return {"response_id": answer.request_id, "item_id": answer.item_id}


def response_metadata(event: AnswerStarted) -> dict[str, str] | None:
    """The client's metadata for the answer ``event`` starts; a watch's answer says which watch."""
    trigger = event.trigger
    if trigger is None:
        return event.metadata
    return {**(event.metadata or {}), "livesight_trigger": "watch", "watch_id": trigger.watch_id}


def answer_item(answer: RunningAnswer, status: str) -> rt.Item:
    """The answer's assistant message item (empty while in progress)."""
    if status == "in_progress":
        content: list[rt.ItemContent] = []
    elif answer.speaks:
        content = [rt.ItemContent(type="output_audio", transcript=answer.text)]
    else:
        content = [rt.ItemContent(type="output_text", text=answer.text)]
    return rt.Item(id=answer.item_id, role="assistant", status=status, content=content)


def answer_part(answer: RunningAnswer) -> rt.ContentPartOut:
    """The answer's content part as it ended."""
    if answer.speaks:
        return rt.ContentPartOut(type="audio", transcript=answer.text)
    return rt.ContentPartOut(type="text", text=answer.text)


def empty_part(speaks: bool) -> rt.ContentPartOut:
    """The answer's content part as ``response.content_part.added`` announces it."""
    return rt.ContentPartOut(type="audio", transcript="") if speaks else rt.ContentPartOut(type="text", text="")


def output_modalities(answer: RunningAnswer) -> list[str]:
    """The answer's modalities in Realtime's words (``["audio"]``: speech with its transcript)."""
    return ["audio"] if answer.speaks else ["text"]


def end_status(event: AnswerEnded) -> tuple[str, rt.StatusDetails]:
    """The response's ``status`` and ``status_details`` for the core's end of the answer."""
    if event.status == "completed" and event.finish_reason == "length":
        return "incomplete", rt.StatusDetails(type="incomplete", reason="max_output_tokens")
    if event.status == "completed":
        return "completed", rt.StatusDetails(type="completed")
    if event.status == "interrupted":
        reason = "turn_detected" if event.interrupted_by == "speech" else "client_cancelled"
        return "cancelled", rt.StatusDetails(type="cancelled", reason=reason)
    error = rt.StatusError(type="server_error", code=event.error_code or "engine_error")
    return "failed", rt.StatusDetails(type="failed", error=error)


def usage(tokens: Usage) -> rt.Usage:
    """The answer's tokens as Realtime counts them."""
    return rt.Usage(
        total_tokens=tokens.prompt_tokens + tokens.completion_tokens,
        input_tokens=tokens.prompt_tokens,
        output_tokens=tokens.completion_tokens,
        input_token_details=rt.InputTokenDetails(
            cached_tokens=tokens.cached_tokens, text_tokens=tokens.text_tokens,
            image_tokens=tokens.image_tokens, audio_tokens=tokens.audio_tokens,
        ),
        output_token_details=rt.OutputTokenDetails(text_tokens=tokens.completion_tokens),
    )
