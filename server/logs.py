"""Logging: text or JSON lines, each carrying the session and answer it is about.

``configure_logging`` installs one handler on the root logger (uvicorn's loggers propagate to
it). Its filter copies ``handlers.session.log_context`` onto every record as ``session_id`` and
``request_id``; the text format appends them as ``session=... request=...``, the JSON format
as fields. ``SessionLog`` is the session observer that writes a line when a session opens,
when an answer ends and when the session closes.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

from handlers.core.events import AnswerEnded, Event, SessionReady
from handlers.session import log_context
from handlers.session.observer import SessionObserver

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"


class SessionContext(logging.Filter):
    """Adds ``session_id``, ``request_id`` and ``context`` (their text form) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        session, request = log_context.session_id.get(), log_context.request_id.get()
        record.session_id = session
        record.request_id = request
        parts = [f"session={session}"] if session else []
        if request:
            parts.append(f"request={request}")
        record.context = (" [" + " ".join(parts) + "]") if parts else ""
        return True


class JsonLines(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, session_id, request_id, exc_info."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("session_id", "request_id"):
            value = getattr(record, key, None)
            if value:
                line[key] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def make_handler(log_format: Literal["text", "json"], stream: object = None) -> logging.Handler:
    """A stream handler (stderr by default) with the session filter and the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(SessionContext())
    handler.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return handler


def configure_logging(level: str, log_format: Literal["text", "json"]) -> None:
    """Route every log line (livesight's, uvicorn's, vLLM's) through one handler on the root logger."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(make_handler(log_format))
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


class SessionLog(SessionObserver):
    """Log lines about one session's life (the context filter adds its ids)."""

    log = logging.getLogger("livesight.session")

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.answers = 0

    def opened(self) -> None:
        self.log.info("session opened (%s)", self.protocol)

    def sent(self, event: Event) -> None:
        if isinstance(event, SessionReady):
            self.log.info("session configured: engine %s", event.capabilities.get("name"))
        elif isinstance(event, AnswerEnded):
            self.answers += 1
            self.log.info(
                "answer %s: %s (%s), ttft %s ms, %d prompt tokens (%d cached), %d generated",
                event.request_id, event.status, event.finish_reason, event.timings.ttft_ms,
                event.usage.prompt_tokens, event.usage.cached_tokens, event.usage.completion_tokens,
            )

    def closed(self) -> None:
        self.log.info("session closed after %d answers", self.answers)
