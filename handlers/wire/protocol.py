"""Protocol v1: every message on ``/v1/video/chat/stream``, as typed events.

Client -> server (JSON text messages, each an object with a ``type``):

    session.config   first message: model, modalities, num_frames, max_frames, system_prompt,
                     use_audio_in_video, enable_frame_filter, frame_filter_threshold, sampling,
                     sampling_params_list, voice, speech_rate, turn_detection,
                     frame_timestamps, prefix_warmup, resume_token
                     (aliases: num_sample_frames, evs_enabled, evs_threshold)
    video.frame      data (base64 JPEG/PNG/WebP), frame_id, pts_ms, source_pts_ms,
                     capture_ts_ms, quality_profile, detail (low / high / auto)
    audio.chunk      data (base64 PCM16 LE, 16 kHz, mono)
    video.query      text, audio_data, range (from_ms, to_ms: ask about remembered moments)
    response.cancel  stop the running answer
    video.done       finish after the running answer
    ping
    watch.create     a standing instruction: watch_id, condition, kind (alert, narrate),
                     threshold, clear_threshold, confirm, clear, cooldown_s, min_interval_s,
                     response (instructions, max_tokens), report_checks
    watch.update     watch_id and the fields to change
    watch.delete     watch_id
    memory.search    search_id, condition and/or text, from_ms, to_ms, limit, threshold
    memory.clear     forget what the session remembers

Server -> client:

    session.ready, video.frame.ack, video.frames.consumed, response.start,
    response.text.delta, response.text.done, response.output_audio.delta,
    response.output_audio.done, response.done, session.done, error, pong,
    session.closing                                           (server shutdown: drain)
    input_audio.speech_started, input_audio.speech_stopped   (server turn detection)
    input_audio.transcript                                    (a spoken question as text)
    watch.created, watch.updated, watch.deleted, watch.check, watch.fired, watch.cleared
    memory.progress, memory.results, memory.cleared

Where each part lives (every name is importable from here too):

    client_events.py  the client events and ``parse_client_event``, the one strict parser
    server_events.py  the server events, ``encode``, and ``parse_server_event`` (a client's)
    strict_json.py    the JSON front end every protocol reads through: no ``NaN``/``Infinity``,
                      no lone surrogate, at most ``MAX_DEPTH`` levels, one code per failure
    fields.py         bounds every protocol shares (frame ids, text lengths, sampling)

Incoming messages are parsed once, by ``parse_client_event``; outgoing events are built as
models, each from one of the core's events (``handlers/core/events.py``, through the v1
codec's table in ``codec.py``), and serialised by ``encode``. Parsing is strict: JSON as the
standard has it, no string holding a lone surrogate (it is not Unicode and could not be sent
back), fields of exactly their type (``"4"``, ``true`` and ``4.0`` are not integers; an
integer is a valid float), finite numbers, and sampling values every engine accepts. A
client parses the server's events back, typed, with ``parse_server_event``.
"""

from __future__ import annotations

from handlers.wire.client_events import (
    CLIENT_TYPES,
    AudioChunkIn,
    ClientEvent,
    MemoryClear,
    MemorySearch,
    MemorySettings,
    Ping,
    ResponseCancel,
    SamplingConfig,
    SessionConfig,
    TurnDetection,
    TurnDetectionChange,
    VideoDone,
    VideoFrame,
    VideoQuery,
    WatchCreate,
    WatchDelete,
    WatchId,
    WatchResponse,
    WatchSpec,
    WatchUpdate,
    describe_validation_error,
    origin_of,
    parse_client_event,
)
from handlers.wire.fields import (
    MAX_SEED,
    MIN_TEMPERATURE,
    FrameId,
)
from handlers.wire.server_events import (
    SERVER_TYPES,
    AnyServerEvent,
    ConsumedFrame,
    ErrorEvent,
    FrameAck,
    FramesConsumed,
    InputAudioSpeechStarted,
    InputAudioSpeechStopped,
    InputAudioTranscript,
    Pong,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTextDone,
    ResponseTrigger,
    ServerEvent,
    SessionClosing,
    SessionDone,
    MemoryCleared,
    MemoryProgress,
    MemoryResult,
    MemoryResults,
    SessionReady,
    Timings,
    UsageInfo,
    WatchCheck,
    WatchCleared,
    WatchCreated,
    WatchDeleted,
    WatchFired,
    WatchUpdated,
    encode,
    parse_server_event,
)

__all__ = [
    "SamplingConfig",
    "TurnDetection",
    "TurnDetectionChange",
    "WatchId",
    "WatchResponse",
    "WatchSpec",
    "SessionConfig",
    "VideoFrame",
    "AudioChunkIn",
    "VideoQuery",
    "ResponseCancel",
    "VideoDone",
    "Ping",
    "WatchCreate",
    "WatchUpdate",
    "WatchDelete",
    "MemorySettings",
    "MemorySearch",
    "MemoryClear",
    "ClientEvent",
    "CLIENT_TYPES",
    "parse_client_event",
    "describe_validation_error",
    "origin_of",
    "FrameId",
    "MAX_SEED",
    "MIN_TEMPERATURE",
    "ServerEvent",
    "SessionReady",
    "FrameAck",
    "ConsumedFrame",
    "FramesConsumed",
    "ResponseTrigger",
    "ResponseStart",
    "ResponseTextDelta",
    "ResponseTextDone",
    "ResponseAudioDelta",
    "ResponseAudioDone",
    "UsageInfo",
    "Timings",
    "ResponseDone",
    "WatchCreated",
    "WatchUpdated",
    "WatchDeleted",
    "WatchCheck",
    "WatchFired",
    "WatchCleared",
    "MemoryProgress",
    "MemoryResult",
    "MemoryResults",
    "MemoryCleared",
    "InputAudioSpeechStarted",
    "InputAudioSpeechStopped",
    "InputAudioTranscript",
    "SessionDone",
    "SessionClosing",
    "ErrorEvent",
    "Pong",
    "encode",
    "AnyServerEvent",
    "SERVER_TYPES",
    "parse_server_event",
]
