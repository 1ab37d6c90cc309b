"""A client in a loop, in a process of its own: ``python -m tests.heavy.server.flooder URL MESSAGE_JSON SECONDS``.

Opens a session, prints ``ready``, then sends MESSAGE back to back for SECONDS (or until the
server closes it) while reading what comes back; prints one JSON line: messages sent, the
error codes received, the close code. A process of its own, so that its loop takes no time
from the victim client it is measured against.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import websockets


async def flood(url: str, message: str, seconds: float) -> dict[str, object]:
    sent, codes = 0, []
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "sampling": {"max_tokens": 1}}))
        json.loads(await ws.recv())
        print("ready", flush=True)

        async def read() -> None:
            try:
                async for raw in ws:
                    event = json.loads(raw)
                    if event["type"] == "error":
                        codes.append(event["code"])
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                await ws.send(message)
                sent += 1
                if sent % 50 == 0:
                    await asyncio.sleep(0)  # let the reader run
        except websockets.ConnectionClosed:
            pass
        await ws.close()
        await asyncio.wait_for(reader, 30)
        return {"sent": sent, "codes": codes, "close_code": ws.close_code}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(flood(sys.argv[1], sys.argv[2], float(sys.argv[3])))), flush=True)
