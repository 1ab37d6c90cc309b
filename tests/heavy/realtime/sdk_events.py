"""A Realtime conversation driven by whatever openai SDK runs this script, checking that every
server event parses strictly into that SDK's own typed models.

Run as ``python sdk_events.py BASE_URL IMAGE...`` (JPEG files) in a virtual environment that
has only the SDK (tests/heavy/realtime/openai-2.txt pins the oldest one livesight follows); it imports
nothing of livesight. It prints one JSON line (the SDK's version and the event types seen) and
exits 1 at the first event the SDK cannot type, or any ``error`` it was not asked to cause.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any, get_args

import openai
from openai import AsyncOpenAI
from openai.types.realtime.realtime_server_event import RealtimeServerEvent

MODELS = {get_args(c.model_fields["type"].annotation)[0]: c for c in get_args(get_args(RealtimeServerEvent)[0])}


class Checked:
    """The connection's events, each checked against the SDK's model for its type."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.seen: list[str] = []

    async def until(self, kind: str, timeout: float = 120) -> list[dict[str, Any]]:
        events = []
        while True:
            raw = await asyncio.wait_for(self.conn.recv_bytes(), timeout)
            event = json.loads(raw)
            model = MODELS.get(event.get("type"))
            if model is None:
                raise SystemExit(f"the SDK knows no event {event.get('type')!r}")
            typed = model.model_validate(event)
            if typed.model_extra or type(self.conn.parse_event(raw)) is not model:
                raise SystemExit(f"{event['type']}: not the SDK's shape ({typed.model_extra})")
            self.seen.append(event["type"])
            events.append(event)
            if event["type"] == kind:
                return events
            if event["type"] == "error":
                raise SystemExit(f"unexpected error: {event['error']}")


async def main(base_url: str, images: list[Path]) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    async with client.realtime.connect(model="livesight") as conn:
        rt = Checked(conn)
        await rt.until("session.created")
        await conn.session.update(session={
            "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 24,
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
        })
        await rt.until("session.updated")
        for n, path in enumerate(images):
            url = "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()
            await conn.conversation.item.create(item={
                "id": f"frame{n}", "type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": url, "detail": "low" if n else "high"}],
            })
            await rt.until("conversation.item.done")
        await conn.conversation.item.create(previous_item_id="root", item={
            "id": "seed", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}],
        })
        await rt.until("conversation.item.done")
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is it?"}],
        })
        await rt.until("conversation.item.done")
        await conn.response.create(response={"metadata": {"client_event_id": "c1"}})
        done = (await rt.until("response.done"))[-1]["response"]
        answer = done["output"][0]["id"]
        await conn.conversation.item.truncate(item_id=answer, content_index=0, audio_end_ms=200)
        await rt.until("conversation.item.truncated")
        await conn.conversation.item.retrieve(item_id=answer)
        await rt.until("conversation.item.retrieved")
        await conn.response.create(response={"conversation": "none", "output_modalities": ["text"],
                                             "input": [{"type": "item_reference", "id": "frame0"}]})
        await rt.until("response.done")
        await conn.send({"type": "output_audio_buffer.clear"})
        await rt.until("output_audio_buffer.cleared")
        await conn.conversation.item.delete(item_id=answer)
        await rt.until("conversation.item.deleted")
        await conn.response.cancel(event_id="cancel1")
        try:
            await rt.until("never")
        except SystemExit as refused:  # the one error asked for: nothing to cancel
            if "response_cancel_not_active" not in str(refused) or "cancel1" not in str(refused):
                raise
            rt.seen.append("error")
    print(json.dumps({"openai": openai.__version__, "seen": sorted(set(rt.seen))}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], [Path(p) for p in sys.argv[2:]]))
