"""What a session says: the core's events, in its own words.

The core (``SessionMachine``, through ``Send`` effects) speaks only these; no wire protocol is
privileged. Each codec maps an event's class to its own messages: protocol v1 through a table
to its wire models (``handlers/wire/codec.py``), the Realtime and Gemini Live codecs through
their own tables. An event carries what any codec needs (the conversation item an answer
becomes, the client event an error answers); a codec shows what its protocol has room for.

The session:

    SessionReady        configured (or resumed): the effective config, limits, capabilities
    ConfigUpdated       the effective config after an update
    SessionDone         the source is done and its last answer ended; the session ends
    SessionClosing      the server is shutting down (``deadline_ms``)
    Pong                a ping answered
    ErrorReported       an error (``closes_session``: the session ends with it)

The camera:

    FrameAcked          a frame taken (or filtered, or shed), the buffer's size, evictions

An answer, from its start to its one end:

    AnswerStarted       an answer started (a watch's ``trigger`` when no question asked it)
    FramesConsumed      the frames its prompt shows (before its first output)
    AnswerTextDelta     a piece of its text
    AnswerAudioDelta    a piece of its audio (a WAV file, base64)
    AnswerTextDone      its whole text
    AnswerAudioDone     its audio ended
    AnswerEnded         its end: status, usage, timings, what stopped it or its error's code
    OutputAudioCleared  its remaining audio will not be sent

Watches:

    WatchCreated, WatchUpdated, WatchDeleted, WatchChecked (one check), WatchFired,
    WatchCleared (an alert armed again)

The microphone:

    SpeechBegan, SpeechEnded       turn detection heard speech start or stop
    QuestionTranscribed            a spoken question as words (for engines that take no audio)
    InputTranscribed               a held spoken turn as words
    AudioCommitted, AudioCleared   the buffered audio became an item, or was dropped
    IdleTimeout                    nobody spoke after an answer: an answer starts by itself

Memory:

    MemoryProgress      a search with a condition: moments checked so far
    MemoryResults       what a search found
    MemoryCleared       the session's memory was deleted

Conversation items:

    InputAdded, ItemDeleted, ItemRetrieved, ItemTruncated
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from handlers.wire.errors import Origin
from handlers.wire.fields import FrameId

Role = Literal["user", "system", "assistant"]


class Event(BaseModel):
    """Something a session says to its client, whatever protocol carries it."""

    model_config = ConfigDict(frozen=True)


# --------------------------------------------------------------------------- the session


class SessionReady(Event):
    """The session is configured: the effective config, its limits and the engine's
    capabilities; ``resumed``: it is a parked session given back (``last_frame_id``: the last
    frame it took)."""

    session_id: str
    config: dict[str, Any]
    limits: dict[str, Any]
    capabilities: dict[str, Any]
    ignored_fields: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    resume_token: str | None = None
    resumed: bool = False
    last_frame_id: FrameId | None = None
    memory_id: str | None = None  # what the session's memory is kept under (None: it keeps none)


class ConfigUpdated(Event):
    """The effective configuration after a ``ConfigUpdate`` (same shape as ``SessionReady``'s)."""

    config: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)  # parts of the update not applied, and why
    ignored: list[str] = Field(default_factory=list)  # the update's fields the server does not know


class SessionDone(Event):
    """The source said it is done and the last answer ended: the session ends."""


class SessionClosing(Event):
    """The server is shutting down: the running answer may finish; the session closes within
    ``deadline_ms``."""

    deadline_ms: int
    reason: Literal["server_shutdown"] = "server_shutdown"


class Pong(Event):
    """A ping answered."""


class ErrorReported(Event):
    """An error with its stable code; ``origin``: the client event it answers; ``wire_code``:
    the code the codec that read that event gave it, when it has its own."""

    code: str
    message: str
    frame_id: FrameId | None = None
    closes_session: bool = False
    retry_after_ms: int | None = None  # ``rate_limited``: wait this long before sending control again
    origin: Origin | None = None
    wire_code: str | None = None


# --------------------------------------------------------------------------- the camera


class FrameAcked(Event):
    """A frame taken into the buffer, filtered as a near-duplicate (``reason`` ``filtered``)
    or shed under load (``overloaded``); the frames the buffer evicted for it; the item it
    follows in the conversation."""

    frame_id: FrameId | None
    pts_ms: float | None = None
    capture_ts_ms: float | None = None
    accepted: bool
    buffered_frames: int
    server_receive_ts_ms: float
    reason: Literal["filtered", "overloaded"] | None = None
    similarity: float | None = None
    dropped_frame_id: FrameId | None = None
    dropped_frame_ids: list[FrameId] = Field(default_factory=list)
    previous_item_id: str | None = None


# --------------------------------------------------------------------------- an answer


class ConsumedFrame(BaseModel):
    """One frame an answer's prompt shows, with its clocks."""

    model_config = ConfigDict(frozen=True)

    frame_id: FrameId | None
    seq: int
    pts_ms: float | None = None
    source_pts_ms: float | None = None
    capture_ts_ms: float | None = None
    server_receive_ts_ms: float
    decoded_ts_ms: float | None = None
    decode_ms: float | None = None
    timestamp_s: float


class WatchTrigger(BaseModel):
    """What started an answer that no question asked for: a watch that fired."""

    model_config = ConfigDict(frozen=True)

    watch_id: str


class AnswerStarted(Event):
    """An answer started: its output modalities, the conversation item it becomes (and the
    one it follows), the client's metadata; ``in_conversation`` false: out of band."""

    request_id: str
    trigger: WatchTrigger | None = None
    modalities: list[str] = Field(default_factory=lambda: ["text"])
    item_id: str | None = None
    metadata: dict[str, str] | None = None
    in_conversation: bool = True
    previous_item_id: str | None = None


class FramesConsumed(Event):
    """The frames an answer's prompt shows; ``frame_ids``: those that have an id."""

    request_id: str
    frame_ids: list[FrameId]
    frames: list[ConsumedFrame]
    latest_pts_ms: float | None = None


class AnswerTextDelta(Event):
    request_id: str
    delta: str


class AnswerTextDone(Event):
    request_id: str
    text: str


class AnswerAudioDelta(Event):
    """A piece of an answer's audio: a complete WAV file (24 kHz mono PCM16), base64."""

    request_id: str
    data: str


class AnswerAudioDone(Event):
    request_id: str


class Usage(BaseModel):
    """An answer's tokens. ``text_tokens`` + ``image_tokens`` + ``audio_tokens`` ==
    ``prompt_tokens``."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0

    @property
    def text_tokens(self) -> int:
        """The prompt tokens that are neither image nor audio tokens."""
        return max(0, self.prompt_tokens - self.image_tokens - self.audio_tokens)


class Timings(BaseModel):
    model_config = ConfigDict(frozen=True)

    ttft_ms: float | None = None
    first_audio_ms: float | None = None
    total_ms: float


class AnswerEnded(Event):
    """An answer's one end: how (``status``), what it cost, how long it took;
    ``interrupted``: what stopped it; ``failed``: the code of the error reported for it."""

    request_id: str
    status: Literal["completed", "interrupted", "failed"]
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    timings: Timings
    trigger: WatchTrigger | None = None
    interrupted_by: Literal["cancel", "question", "speech", "session_end"] | None = None
    error_code: str | None = None


class OutputAudioCleared(Event):
    """The running answer's remaining audio will not be sent."""


# --------------------------------------------------------------------------- watches


class WatchCreated(Event):
    """A watch as the server runs it (every field effective), and the tokens one check adds
    to the warm prefix."""

    watch: dict[str, Any]
    tokens_per_check: int | None = None


class WatchUpdated(Event):
    watch: dict[str, Any]


class WatchDeleted(Event):
    watch_id: str


class WatchChecked(Event):
    """One check of a watch (reported only with ``report_checks``)."""

    watch_id: str
    frame_id: FrameId | None = None
    probability: float
    ms: float


class WatchFired(Event):
    """A watch fired on the frame ``frame_id``; its answer follows. ``decision_ms``: from that
    frame's receipt to this event."""

    watch_id: str
    frame_id: FrameId | None = None
    pts_ms: float | None = None
    probability: float
    decision_ms: float | None = None


class WatchCleared(Event):
    """An alert's condition is no longer true: it is armed again."""

    watch_id: str
    frame_id: FrameId | None = None
    probability: float


# --------------------------------------------------------------------------- the microphone


class SpeechBegan(Event):
    """Turn detection heard speech start (ms since the session's first audio sample);
    ``item_id``: the core's id for this speech."""

    audio_start_ms: float
    item_id: str | None = None


class SpeechEnded(Event):
    """Turn detection heard speech stop; ``previous_item_id``: the item its item follows."""

    audio_start_ms: float
    audio_end_ms: float
    item_id: str | None = None
    previous_item_id: str | None = None


class QuestionTranscribed(Event):
    """A spoken question as text (for engines that take no audio); the answer uses it."""

    request_id: str
    transcript: str
    audio_ms: float


class InputTranscribed(Event):
    """A spoken turn that waits for the next answer (turn detection with ``create_response``
    off, or speech over an answer it may not interrupt) was transcribed: the words replace its
    audio. ``item_id`` is the speech's (``SpeechBegan``'s ``item_id``)."""

    item_id: str
    transcript: str
    audio_ms: float


class AudioCommitted(Event):
    item_id: str
    audio_ms: float
    previous_item_id: str | None = None


class AudioCleared(Event):
    """The buffered, uncommitted audio was dropped."""


class IdleTimeout(Event):
    """Nobody spoke for ``turn_detection.idle_timeout_ms`` after an answer: an answer starts by
    itself. ``audio_start_ms`` / ``audio_end_ms``: the silent stretch of the microphone stream."""

    item_id: str
    audio_start_ms: float
    audio_end_ms: float


# --------------------------------------------------------------------------- conversation items


class InputAdded(Event):
    """An item joined the conversation after ``previous_item_id`` (None: first); ``at_end``:
    it is the conversation's newest item (else it was put before others)."""

    item_id: str
    role: Role
    text: str | None = None
    audio_ms: float | None = None
    previous_item_id: str | None = None
    at_end: bool = True


class ItemDeleted(Event):
    item_id: str


class ItemRetrieved(Event):
    """An item as the core holds it: a frame (``image`` as a data URL), an input, or a
    message of the conversation (an assistant's: ``text``, and ``audio_ms`` when spoken)."""

    item_id: str
    role: Role
    kind: Literal["image", "input", "message"]
    text: str | None = None
    image: str | None = None
    audio_ms: float | None = None


class ItemTruncated(Event):
    item_id: str
    content_index: int
    audio_end_ms: int


class MemoryProgress(Event):
    """A memory search with a condition: ``checked`` of ``total`` moments so far."""

    search_id: str | None = None
    checked: int
    total: int


class MemoryHit(BaseModel):
    """One remembered moment a search found (see ``MemoryResults``)."""

    model_config = ConfigDict(frozen=True)

    moment_id: int
    start_ms: float
    end_ms: float
    probability: float | None = None
    match: str | None = None
    kind: str | None = None
    caption: str | None = None
    url: str


class MemoryResults(Event):
    """What a memory search found, best first; ``skipped``: moments whose check did not run."""

    search_id: str | None = None
    results: list[MemoryHit]
    checked: int = 0
    skipped: int = 0


class MemoryCleared(Event):
    """The session's memory was deleted: ``deleted`` records."""

    deleted: int
