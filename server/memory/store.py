"""The session memory's types and the interface every backend implements.

A session's memory is a timeline. A *moment* is a keyframe (its JPEG) from its start until the
next moment of the session starts; the newest moment has no end yet (its ``end_ms`` reads as its
start). A *note* is a piece of text at one instant (a transcript, a question, an answer, a watch
firing, a caption), tied to the moment current at that instant.

A range ``[from_ms, to_ms]`` holds the moment current at ``from_ms`` and every moment starting by
``to_ms``, and the notes whose time lies in it. Stored bytes are JPEG bytes plus the UTF-8 bytes
of captions and notes; past a limit, the oldest moments go first, each with its notes.

A *resume handle* (a digest of a resume token) lets a client that reconnects, to this server or to
another one sharing the store, find a session's memory again. Handles are kept apart from the
timeline: they count no bytes, the limits never delete them, and each one is taken only once.
"""

from __future__ import annotations

import abc
import hmac
import re
from dataclasses import dataclass
from typing import Literal, get_args

NoteKind = Literal["transcript", "question", "answer", "fire", "caption"]
NOTE_KINDS: tuple[str, ...] = get_args(NoteKind)

#: The most items one call returns, whatever ``limit`` or ``n`` asks for.
MAX_ITEMS = 1000
#: The longest session id a store accepts.
MAX_SESSION_ID = 128
#: The most words of a search that are matched (the rest are ignored).
MAX_SEARCH_WORDS = 32
#: The longest resume handle, and the longest owner, a store accepts.
MAX_HANDLE = 128
#: The most resume handles one session keeps; keeping more deletes its oldest.
MAX_HANDLES_PER_SESSION = 16

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class MemoryLimits:
    """How much a store keeps: by age, per session and in all."""

    max_age_s: float  # moments and notes older than this are deleted by sweep()
    max_session_bytes: int  # one session's stored bytes; past it its oldest moments go
    max_bytes: int  # the whole store's stored bytes; past it the oldest moments of any session go

    def __post_init__(self) -> None:
        if self.max_age_s <= 0 or self.max_session_bytes <= 0 or self.max_bytes <= 0:
            raise ValueError(f"memory limits must be positive: {self}")


@dataclass(frozen=True)
class Moment:
    """One keyframe of a session and the time it stood for."""

    moment_id: int
    session_id: str
    start_ms: float  # wall clock, ms since the epoch
    end_ms: float  # start of the next moment of the session, or start_ms while it is the newest
    jpeg_bytes: int
    caption: str | None


@dataclass(frozen=True)
class Note:
    """One piece of text a session heard, said or saw, at one instant."""

    note_id: int
    session_id: str
    kind: NoteKind
    at_ms: float
    text: str
    moment_id: int | None  # the session's moment current at at_ms, or None when there was none


@dataclass(frozen=True)
class TextHit:
    """A caption or note found by a text search."""

    at_ms: float  # the note's time, or the start of the captioned moment
    kind: str  # "caption" (a moment's caption) or a note kind
    text: str
    moment: Moment | None  # the moment it belongs to


class MemoryStore(abc.ABC):
    """Where sessions' moments and notes are kept. Every method may be called concurrently from one
    event loop; lists come oldest first unless said otherwise, and hold at most ``MAX_ITEMS``."""

    backend: str  # "sqlite" | "postgresql"

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, and create the schema when it is missing (safe to repeat)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Disconnect; the store is unusable afterwards."""

    @abc.abstractmethod
    async def add_moment(self, session_id: str, at_ms: float, jpeg: bytes) -> Moment:
        """Store a keyframe starting at ``at_ms`` (ending the moment before it there), then delete
        the oldest moments past the limits (never this one). Returns the new moment."""

    @abc.abstractmethod
    async def set_caption(self, session_id: str, moment_id: int, caption: str) -> None:
        """Give a moment of the session its caption (replacing any); a gone moment is ignored."""

    @abc.abstractmethod
    async def add_note(self, session_id: str, kind: str, at_ms: float, text: str) -> Note:
        """Store a note, tied to the moment current at ``at_ms``. Returns it; raises ValueError
        for a kind not in ``NOTE_KINDS``."""

    @abc.abstractmethod
    async def moments(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Moment]:
        """The session's moments in the range (open ends: unbounded), oldest first."""

    @abc.abstractmethod
    async def spread(self, session_id: str, from_ms: float, to_ms: float, n: int) -> list[tuple[Moment, bytes]]:
        """At most ``n`` moments of the range with their JPEGs, oldest first: those current at
        ``n`` instants evenly spaced over it (its ends when ``n >= 2``, its middle when ``n == 1``)."""

    @abc.abstractmethod
    async def jpeg(self, session_id: str, moment_id: int) -> bytes | None:
        """A moment's JPEG, or None when the session has no such moment."""

    @abc.abstractmethod
    async def search_text(
        self, session_id: str, text: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 20
    ) -> list[TextHit]:
        """Captions and notes of the range holding every word of ``text`` (read as plain words,
        never as query syntax), newest first; no words: no hits."""

    @abc.abstractmethod
    async def notes(
        self, session_id: str, from_ms: float | None = None, to_ms: float | None = None, limit: int = 1000
    ) -> list[Note]:
        """The session's notes in the range, oldest first."""

    @abc.abstractmethod
    async def clear(self, session_id: str) -> int:
        """Delete everything of the session (its resume handles too), its bytes gone from the files
        where the backend can. Returns the moments and notes deleted."""

    @abc.abstractmethod
    async def sweep(self, now_ms: float) -> int:
        """Delete moments that ended, notes made and resume handles kept more than ``max_age_s``
        before ``now_ms``. Returns the moments and notes deleted."""

    @abc.abstractmethod
    async def keep_handle(self, handle: str, session_id: str, owner: str, at_ms: float) -> None:
        """Remember that ``handle`` resumes the session's memory for a client presenting ``owner`` (a
        digest of its API key, "" when keys are off), replacing any row of the same handle; past
        ``MAX_HANDLES_PER_SESSION`` the session's oldest handles are deleted. Raises ValueError for an
        empty handle, or a handle or owner longer than ``MAX_HANDLE`` or holding NUL."""

    @abc.abstractmethod
    async def take_handle(self, handle: str, owner: str) -> str | None:
        """The session id ``handle`` resumes when it was kept for ``owner``, deleting the handle so that
        it never works twice (of concurrent callers, only one gets the id); None otherwise. A handle
        kept for another owner stays."""

    @abc.abstractmethod
    async def claim(self, session_id: str, owner: str, at_ms: float) -> None:
        """Record that the session's memory belongs to ``owner`` (a digest of an API key, "" when
        keys are off) unless it belongs to someone already (the first claim stays); its row goes
        with ``clear``, and with ``sweep`` once the session holds nothing and the claim is older
        than ``max_age_s``. Raises ValueError as ``keep_handle`` does for the owner."""

    @abc.abstractmethod
    async def owner(self, session_id: str) -> str | None:
        """Whom the session's memory belongs to (None: no claim, as for memory kept before owners were)."""

    @abc.abstractmethod
    async def usage(self, session_id: str | None = None) -> int:
        """Stored bytes of the session, or of the whole store."""

    @abc.abstractmethod
    async def has(self, session_id: str) -> bool:
        """Whether the session has any moment or note stored."""


def checked_session(session_id: str) -> str:
    """``session_id`` when a store accepts it; raises ValueError when empty, too long or holding NUL."""
    if not session_id or len(session_id) > MAX_SESSION_ID or "\x00" in session_id:
        raise ValueError(f"a session id has 1 to {MAX_SESSION_ID} characters and no NUL")
    return session_id


def checked_handle(handle: str, owner: str) -> tuple[str, str]:
    """``handle`` and ``owner`` when a store accepts them; raises ValueError for an empty handle, or a
    handle or owner longer than ``MAX_HANDLE`` or holding NUL."""
    if not handle or max(len(handle), len(owner)) > MAX_HANDLE or "\x00" in handle + owner:
        raise ValueError(f"a resume handle has 1 to {MAX_HANDLE} characters, its owner at most as many, and no NUL")
    return handle, owner


def same_owner(kept: str, presented: str) -> bool:
    """Whether ``presented`` is the owner a handle was kept for, compared in constant time."""
    return hmac.compare_digest(kept.encode(), presented.encode())


def checked_kind(kind: str) -> NoteKind:
    """``kind`` as a note kind; raises ValueError for any other string."""
    if kind not in NOTE_KINDS:
        raise ValueError(f"a note kind is one of {', '.join(NOTE_KINDS)}, not {kind!r}")
    return kind  # type: ignore[return-value]


def clamped(limit: int) -> int:
    """``limit`` within 0 and ``MAX_ITEMS``."""
    return max(0, min(int(limit), MAX_ITEMS))


def search_words(text: str) -> list[str]:
    """The words of a user's search (letters, digits and underscores), the first ``MAX_SEARCH_WORDS``."""
    return _WORD.findall(text)[:MAX_SEARCH_WORDS]


def spread_instants(from_ms: float, to_ms: float, n: int) -> list[float]:
    """``n`` instants evenly spaced over ``[from_ms, to_ms]``: its ends included when ``n >= 2``,
    its middle when ``n == 1``; none when ``n < 1`` or the range is reversed."""
    n = clamped(n)
    if n == 0 or from_ms > to_ms:
        return []
    if n == 1:
        return [(from_ms + to_ms) / 2]
    step = (to_ms - from_ms) / (n - 1)
    return [from_ms + i * step for i in range(n - 1)] + [to_ms]


def stored_text(text: str) -> str:
    """A caption or note as every backend can keep it: NUL (which PostgreSQL's text refuses) as U+FFFD."""
    return text.replace("\x00", "\ufffd")


def text_bytes(text: str | None) -> int:
    """What a caption or note counts towards the limits: its UTF-8 length."""
    return 0 if text is None else len(text.encode())
