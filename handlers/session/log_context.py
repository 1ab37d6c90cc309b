"""Which session and which answer the running code works for, for log lines.

The session sets ``session_id`` when it starts and each answer task sets ``request_id``;
tasks started in the session's task group and worker threads started through anyio inherit
them (a copy of the context), so every log line written on their behalf can carry both. The
server's logging filter reads them (``server/logs.py``).
"""

from __future__ import annotations

from contextvars import ContextVar

session_id: ContextVar[str | None] = ContextVar("livesight_session_id", default=None)
request_id: ContextVar[str | None] = ContextVar("livesight_request_id", default=None)
