"""The one JSON front end of every wire protocol: a client message read as a JSON object.

v1, OpenAI Realtime and Gemini Live all read their messages here, so the same bytes get the
same answer on every endpoint (each codec then says it in its own envelope: a v1 ``error``,
a Realtime ``error``, a Live close). The rules, each failure with one code and one message:

    a binary message      read as its UTF-8 text where the protocol allows it (Live);
                          elsewhere refused: ``invalid_message``. Not UTF-8: ``invalid_json``
    larger than the limit ``invalid_message`` (the server's ``max_message_bytes``, counted in
                          UTF-8 bytes for text and binary alike; the WebSocket layer
                          closes with 1009 first at the same limit, so this holds for a
                          codec used behind any transport)
    not JSON              ``invalid_json``; ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON
    not an object         ``invalid_message``
    nested too deeply     ``invalid_message``: more than ``MAX_DEPTH`` objects and arrays one
                          inside another (a message of any protocol needs under ten)
    a lone surrogate      ``invalid_message``: a string (a key too) holding ``\\ud800``-``\\udfff``
                          unpaired is not Unicode text and could not be sent back

A refused message is not read further, so nothing of it (its ``type``, its ``event_id``)
is echoed in the error.
"""

from __future__ import annotations

import json
from typing import Any

from handlers.wire.errors import ErrorCode, SessionError

#: The most objects and arrays nested one inside another in a client message.
MAX_DEPTH = 32

NOT_JSON = "message is not valid JSON"
NOT_UTF8 = "a binary message must hold UTF-8 JSON"
BINARY = "binary messages are not supported; send JSON text"
NOT_OBJECT = "message must be a JSON object"
TOO_DEEP = f"message is nested more than {MAX_DEPTH} levels deep"
LONE_SURROGATE = "a string in the message holds a lone surrogate (\\ud800-\\udfff): not Unicode text"


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for every message (``json.loads`` with an argument builds a new one per call).
_decoder = json.JSONDecoder(parse_constant=_no_constant)


def read_json_object(raw: str | bytes, *, binary: bool = False, max_bytes: int | None = None) -> dict[str, Any]:
    """One client message as the JSON object it holds.

    ``binary``: a binary message is read as UTF-8 text (else refused); ``max_bytes``: the
    largest message (None: the transport's limit only). Raises ``SessionError`` with
    ``invalid_json`` or ``invalid_message`` (see the module's table).
    """
    if isinstance(raw, bytes):
        if not binary:
            raise SessionError(ErrorCode.INVALID_MESSAGE, BINARY)
        _check_size(len(raw), max_bytes)
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SessionError(ErrorCode.INVALID_JSON, NOT_UTF8) from None
    elif max_bytes is not None:
        _check_size(len(raw) if raw.isascii() else len(raw.encode("utf-8", "surrogatepass")), max_bytes)
    try:
        obj = _decoder.decode(raw)
    except RecursionError:  # nested past the interpreter's limit: past ours too
        raise SessionError(ErrorCode.INVALID_MESSAGE, TOO_DEEP) from None
    except ValueError:
        raise SessionError(ErrorCode.INVALID_JSON, NOT_JSON) from None
    if not isinstance(obj, dict):
        raise SessionError(ErrorCode.INVALID_MESSAGE, NOT_OBJECT)
    _check_content(obj)
    return obj


def _check_size(size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise SessionError(ErrorCode.INVALID_MESSAGE, f"message is larger than {max_bytes} bytes")


def _check_content(obj: dict[str, Any]) -> None:
    """Raises ``invalid_message`` for nesting deeper than ``MAX_DEPTH`` or a lone surrogate."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise SessionError(ErrorCode.INVALID_MESSAGE, LONE_SURROGATE) from None
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise SessionError(ErrorCode.INVALID_MESSAGE, TOO_DEEP)
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((value, depth + 1) for value in item.values())
            else:
                stack.extend((value, depth + 1) for value in item)
