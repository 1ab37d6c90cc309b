"""All of livesight's settings in one object.

Every field can be given as a ``livesight serve`` flag (``--max-frame-bytes``) or as an
environment variable ``LIVESIGHT_<FIELD>`` (``LIVESIGHT_MAX_FRAME_BYTES``). No other module
reads the environment.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MiB = 1024 * 1024


def default_data_dir() -> Path:
    """Where the server keeps what must outlive it (the memory store) unless ``data_dir`` says
    otherwise: ``$XDG_DATA_HOME/livesight``, else ``~/.local/share/livesight``."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "livesight"


def default_cache_dir() -> Path:
    """Where the generated demo model lives unless ``cache_dir`` says otherwise."""
    return Path.home() / ".cache" / "livesight"


class Settings(BaseSettings):
    """Server settings. Limits are per session unless the description says otherwise."""

    model_config = SettingsConfigDict(env_prefix="LIVESIGHT_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 = any free port)")
    engine: Literal["transformers", "vllm", "openai"] = Field(
        "transformers", description="inference engine: transformers (embedded), vllm (in process), openai (remote)"
    )
    model: str | None = Field(None, description="model path or id; none = the generated demo model")
    device: str = Field("cpu", description="torch device for the transformers engine (cpu, cuda, cuda:1)")
    dtype: str = Field("auto", description="model dtype: auto, float32, bfloat16, float16")
    trust_remote_code: bool = Field(False, description="allow model code shipped with the model")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="where the demo model is generated")
    log_level: str = Field("info", description="logging level")
    log_format: Literal["text", "json"] = Field(
        "text", description="log lines as text or as JSON objects; both carry the session and request ids"
    )

    config_timeout_s: float = Field(10.0, gt=0, description="deadline for the first message")
    idle_timeout_s: float = Field(
        60.0, gt=0, description="close a session that sends nothing this long while no answer runs"
    )
    max_frame_bytes: int = Field(10 * MiB, ge=1024, description="largest video.frame payload (base64 text)")
    max_audio_bytes: int = Field(4 * MiB, ge=1024, description="largest buffered PCM audio per session")
    max_message_bytes: int = Field(16 * MiB, ge=1024, description="largest WebSocket message")
    max_queue: int = Field(
        200, ge=1, description="client messages read ahead per session, in each of its two lanes (frames; "
        "everything else)"
    )
    control_rate_per_s: float = Field(
        50.0, gt=0, description="control messages (ping, questions, cancels, config updates, items, messages "
        "that do not parse) a session may send per second, on average; more get rate_limited"
    )
    control_burst: int = Field(100, ge=1, description="control messages a session may send at once above its rate")
    answer_rate_per_s: float = Field(
        10.0, gt=0, description="messages that start or stop an answer (video.query, response.create, "
        "response.cancel) a session may send per second, on average"
    )
    answer_burst: int = Field(20, ge=1, description="such messages a session may send at once above its rate")
    max_watches: int = Field(8, ge=0, le=64, description="standing instructions (watches) a session may hold")
    min_check_interval_ms: float = Field(
        250.0, ge=0, description="a session checks its watches at most this often (after accepted frames, "
        "when nothing else runs on its engine)"
    )
    rate_limit_close_s: float = Field(
        10.0, gt=0, description="a session still over its control budget this long after its first refusal "
        "is closed (too_many_messages, close code 1008)"
    )
    max_sessions: int = Field(64, ge=1, description="concurrent sessions; more are refused")
    resume_grace_s: float = Field(
        30.0, ge=0, description="a dropped session waits this long for its client to resume it (0: no resume)"
    )
    max_parked_sessions: int = Field(
        16, ge=1, description="dropped sessions kept for resume, whole server (the oldest goes first)"
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM: how long running answers may finish before sessions close with 1012"
    )
    max_image_side: int = Field(
        1024, ge=32, description="frames are decoded at most this large (the model may ask for less)"
    )
    decode_threads: int = Field(2, ge=1, le=64, description="threads for image decoding (whole server)")
    pixel_pool_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="memory of released decoded frames kept for the next decodes "
        "(whole server), so a steady stream reuses pixels instead of faulting in fresh pages"
    )
    model_yield_ms: float = Field(
        20.0, ge=0, le=1000, description="before each model step, the embedded engine waits while frames are "
        "being decoded, up to this long (0: never), so intake comes first on a full CPU"
    )
    transparent_huge_pages: bool = Field(
        False, description="let the kernel back the server's memory with transparent huge pages (Linux); off: "
        "the process opts out, since khugepaged's page collapses stalled the whole server for 40-80 ms"
    )
    model_nice: int = Field(
        10, ge=0, le=19, description="the embedded engine's model thread runs this many nice steps below the "
        "server (Linux), so intake and acks come first when the cores are full"
    )
    model_threads: int = Field(
        0, ge=0, le=1024, description="torch threads for the embedded engine's model steps; 0: one for a model of "
        "under 50M parameters (its steps are too small to share: a second thread only spins), else torch's default"
    )
    max_history_turns: int = Field(
        4, ge=0, le=64, description="older questions and answers (whose frames have left) kept in the prompt, as text"
    )
    max_history_tokens: int = Field(
        1024, ge=0, description="bound on that text history, in tokens (estimated at 4 characters a token)"
    )
    max_answer_tokens: int = Field(1024, ge=1, description="upper bound on sampling.max_tokens")
    max_cached_images: int = Field(
        32, ge=1, description="preprocessed images (pixel tensors, ~5 MB each for a 640x480 frame) kept for "
        "re-prefill, whole server"
    )
    max_cached_tokens: int = Field(
        200_000, ge=1, description="KV-cache tokens kept across all sessions (least recently used are dropped)"
    )
    kv_shift: bool = Field(
        True, description="embedded engine: when frames leave the front of a warm prefix, move the rest of its "
        "KV cache up (keys re-rotated to their new positions) instead of computing it again; the session then "
        "evicts one frame at a time. Off: half the window goes at once and the prefix is rebuilt"
    )

    # Intake: read-ahead in bytes, image checks before decoding, load shedding.
    max_read_ahead_bytes: int = Field(
        32 * MiB, ge=1024, description="bytes of client messages read but not yet handled, per session; "
        "frames beyond it are acked as overloaded"
    )
    max_server_read_ahead_bytes: int = Field(
        512 * MiB, ge=1024, description="bytes of client messages read but not yet handled, whole server; "
        "frames beyond it are acked as overloaded"
    )
    intake_max_wait_ms: float = Field(
        25.0, gt=0, description="a frame that cannot start decoding this long after it was read is acked as "
        "overloaded (load shedding); its ack comes about this long after the frame was read"
    )
    max_image_pixels: int = Field(
        3840 * 2160, ge=1024, description="largest frame in pixels (width x height), checked from the image "
        "header before decoding; larger frames get invalid_image"
    )
    max_image_aspect_ratio: float = Field(
        20.0, ge=1, le=200, description="largest long side / short side of a frame, checked from the header; "
        "more elongated frames get invalid_image"
    )
    heavy_image_pixels: int = Field(
        1920 * 1080, ge=1024, description="frames above this many pixels (and every PNG or WebP above a quarter of it) "
        "decode on at most decode_threads - 1 threads, so they cannot take the whole pool"
    )

    # Transport: the WebSocket server (one place builds it: server/listener.py).
    max_pending_connections: int = Field(
        1024, ge=1, description="connections waiting for their session.config, whole server (not counted in "
        "max_sessions); when full, the one that waited longest is closed"
    )
    max_send_buffer_bytes: int = Field(
        4 * MiB, ge=65536, description="bytes queued for a client that does not read (pongs included) before it "
        "is disconnected with close code 1008"
    )
    send_timeout_s: float = Field(
        30.0, gt=0, description="a client that reads nothing this long while the server has events for it is "
        "disconnected with close code 1008"
    )
    ssl_certfile: Path | None = Field(
        None, description="TLS certificate chain (PEM): serve https and wss on every endpoint (none: plain ws); "
        "the google-genai Live client connects only with TLS"
    )
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM) for ssl_certfile")
    ssl_keyfile_password: SecretStr | None = Field(None, description="password of an encrypted ssl_keyfile")
    ws_ping_interval_s: float = Field(20.0, gt=0, description="WebSocket keepalive ping interval")
    ws_ping_timeout_s: float = Field(
        60.0, gt=0, description="close a connection whose keepalive ping gets no pong this long (close code 1011)"
    )
    ws_compression: bool = Field(
        False, description="offer permessage-deflate (base64 JPEG hardly compresses; costs ~0.5 ms per frame)"
    )

    # vLLM engine (engine=vllm): passed through to vLLM's engine arguments.
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM: GPUs each layer is split across (tensor parallel)")
    pipeline_parallel_size: int = Field(1, ge=1, description="vLLM: stages (GPUs or nodes) the layers are split across")
    max_model_len: int | None = Field(
        None, ge=16, description="vLLM: longest prompt plus answer in tokens (none: the model's)"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="vLLM: fraction of each GPU's memory it may take (none: vLLM's default)"
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="vLLM: KV-cache size in bytes, instead of a memory fraction (CPU, unset: 25% of free memory)"
    )
    enforce_eager: bool = Field(False, description="vLLM: no CUDA graphs or compilation (starts faster, runs slower)")
    max_images_per_prompt: int = Field(
        64, ge=1, le=256,
        description=(
            "most frames one prompt may carry: vLLM's limit_mm_per_prompt; for engine=openai the remote "
            "server's (its --limit-mm-per-prompt). A session's max_frames is capped to it"
        ),
    )
    vllm_args: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description='vLLM: any other engine arguments as JSON, e.g. {"max_num_seqs": 32}'
    )

    # Remote engine (engine=openai).
    openai_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="OpenAI-compatible servers, comma-separated; each session sticks to one"
    )
    openai_api_key: SecretStr | None = Field(None, description="bearer token sent to the OpenAI-compatible servers")
    openai_timeout_s: float = Field(120.0, gt=0, description="longest wait for a remote server's next byte")
    openai_health_interval_s: float = Field(
        5.0, gt=0, description="how long a replica that failed its health check is skipped before the next check"
    )
    openai_audio: bool = Field(
        False, description="ask the remote server for spoken answers too (vLLM-Omni: modalities text and audio)"
    )
    openai_image_references: bool = Field(
        True,
        description="name images a replica already holds by uuid alone (vLLM's chat API); off: every request "
        "carries every image",
    )
    openai_session_headers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["X-Session-ID"],
        description="headers every request of a session carries with its session id, comma-separated, so a "
        "router (llm-d, vLLM's production-stack router, Ray Serve, HAProxy) pins the session to one backend "
        "(e.g. X-Session-ID,x-dynamo-session-id; empty: none)",
    )
    max_warmups_per_s: float = Field(
        2.0, gt=0, le=100, description="vllm, openai: warm (prefix) requests one session may start per second"
    )

    # Voice: speech out when the engine has no voice, microphone in, server turn detection.
    speech: Literal["espeak", "openai", "off"] = Field(
        "espeak",
        description="how answers are spoken when the engine has no voice: espeak (embedded), openai (speech_url), off",
    )
    speech_url: str | None = Field(None, description="OpenAI-compatible server for /v1/audio/speech (speech=openai)")
    speech_model: str = Field("tts-1", description="model named in /v1/audio/speech requests")
    speech_voice: str | None = Field(None, description="voice when a session names none (espeak: en-us, openai: alloy)")
    speech_api_key: SecretStr | None = Field(None, description="bearer token for speech_url")
    transcription: Literal["pocketsphinx", "openai", "off"] = Field(
        "pocketsphinx",
        description="how spoken questions become text for engines that take no audio: pocketsphinx (embedded), "
        "openai (transcription_url), off",
    )
    transcription_url: str | None = Field(
        None, description="OpenAI-compatible server for /v1/audio/transcriptions (transcription=openai)"
    )
    transcription_model: str = Field("whisper-1", description="model named in /v1/audio/transcriptions requests")
    transcription_language: str | None = Field(None, description="language hint for remote transcription (ISO 639-1)")
    transcription_api_key: SecretStr | None = Field(None, description="bearer token for transcription_url")
    transcription_workers: int = Field(
        1, ge=1, le=16, description="questions transcribed at once, whole server (pocketsphinx: recogniser processes)"
    )
    speech_workers: int = Field(4, ge=1, le=64, description="remote speech requests at once, whole server")
    voice_timeout_s: float = Field(30.0, gt=0, description="longest remote speech or transcription request")
    server_vad: bool = Field(True, description="offer server turn detection (Silero VAD) to sessions")
    speech_max_sentence_chars: int = Field(
        160, ge=16, le=4000, description="longest text spoken as one piece; longer sentences are cut at a space"
    )
    speech_max_pending_sentences: int = Field(
        16, ge=1, le=1024, description="sentences waiting for speech per answer (generation waits beyond it)"
    )
    speech_sentence_pause_ms: float = Field(
        120.0, ge=0, le=2000, description="silence after each spoken sentence (sentences are synthesized apart)"
    )
    native_audio_trim_ms: float = Field(
        20.0, ge=0, le=1000, description="cut from the start of each answer's engine audio (codec start-up artefact)"
    )

    # Memory: moments of what each session saw, kept in a database.
    data_dir: Path = Field(default_factory=default_data_dir, description="where the memory store's SQLite file lives")
    memory_url: str | None = Field(
        None, description="the memory store: none = SQLite in data_dir, sqlite:///PATH, postgresql://..., or off"
    )
    memory_default: bool = Field(True, description="sessions remember unless their session.config says otherwise")
    memory_keyframe_s: float = Field(10.0, gt=0, le=3600, description="a keyframe at least this often (and at each scene change)")
    memory_min_keyframe_s: float = Field(
        1.0, ge=0, le=3600, description="scene changes make a keyframe at most this often"
    )
    memory_scene_similarity: float = Field(
        0.1, ge=0, le=1, description="a scene change: less than this share of the frame unchanged since the last keyframe"
    )
    memory_caption_prompt: str = Field(
        "Describe what you see in a few words.", min_length=1, max_length=1000,
        description="what the model is asked for each moment's caption (on the warm prefix)",
    )
    memory_caption_tokens: int = Field(12, ge=0, le=64, description="a moment's caption at most this long (0: no captions)")
    memory_context_chars: int = Field(
        400, ge=0, le=8000,
        description="prompts open with the captions of what left the window, at most this many characters (0: none)",
    )
    memory_max_age_s: float = Field(7 * 86400.0, gt=0, description="moments and notes older than this are deleted")
    memory_max_session_bytes: int = Field(
        256 * MiB, ge=MiB, description="a session's stored bytes; past it its oldest moments are deleted"
    )
    memory_max_bytes: int = Field(
        4096 * MiB, ge=MiB, description="the whole store's bytes, whole server; past it the oldest moments are deleted"
    )
    memory_max_pending_writes: int = Field(
        512, ge=1, le=1_000_000, description="records waiting to be written, whole server; past it new ones are dropped"
    )
    memory_max_search_moments: int = Field(
        3600, ge=1, le=100_000, description="moments one memory.search checks at most"
    )

    # WebRTC calls (POST /v1/realtime/calls) and ephemeral keys (POST /v1/realtime/client_secrets).
    webrtc_ice_servers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="STUN/TURN servers the server's side of a call uses, comma-separated "
        "(stun:HOST:PORT, turn:USER:PASSWORD@HOST:PORT); empty: host candidates only",
    )
    webrtc_connect_timeout_s: float = Field(
        20.0, gt=0, le=300, description="a call whose data channel has not opened by then is ended and freed"
    )
    webrtc_peer_timeout_s: float = Field(
        10.0, ge=2, le=300,
        description="a call's peer that answers no ICE consent check for about this long has vanished: its call and session end",
    )
    webrtc_max_pending_messages: int = Field(
        256, ge=8, le=100_000, description="a call's data-channel messages and media read but not yet taken; a peer past it is ended"
    )
    webrtc_max_buffered_bytes: int = Field(
        4 * MiB, ge=64 * 1024, description="a call's data-channel bytes not yet sent; a peer that reads none past it is ended"
    )
    webrtc_max_audio_out_s: float = Field(
        120.0, gt=0, le=3600, description="spoken answer audio a call queues for its outgoing track; more is dropped"
    )
    webrtc_frame_side: int = Field(
        640, ge=64, le=4096, description="a camera track's sampled frame is scaled to at most this many pixels a side"
    )
    max_client_secrets: int = Field(
        10_000, ge=1, le=1_000_000, description="ephemeral keys alive at once; past it the one closest to expiry goes"
    )

    # Cameras the server pulls itself (POST /v1/streams).
    streams: Path | None = Field(None, description="a file of streams to pull from the start (YAML or JSON)")
    max_streams: int = Field(32, ge=0, le=1000, description="cameras the server pulls at a time")
    stream_frame_side: int = Field(
        640, ge=64, le=4096, description="a stream's sampled frame is scaled to at most this many pixels a side"
    )
    stream_max_pending_frames: int = Field(
        8, ge=1, le=1000, description="a stream's sampled frames waiting for its session; more are shed"
    )
    stream_open_timeout_s: float = Field(10.0, gt=0, le=300, description="a source not open by then is tried again later")
    stream_read_timeout_s: float = Field(
        5.0, gt=0, le=300, description="a source that sends nothing this long has stalled: it is reconnected"
    )
    stream_retry_max_s: float = Field(
        30.0, ge=1, le=3600, description="the longest wait between reconnects (doubling from 1 s, with jitter)"
    )
    stream_max_lookback_s: float = Field(
        30.0, ge=0, le=300, description="the most seconds of frames before a fire a stream keeps as its evidence"
    )
    stream_max_events: int = Field(
        10_000, ge=1, le=10_000_000, description="events (fires, narrations) each stream keeps; the oldest go"
    )
    stream_lease_s: float = Field(
        15.0, ge=1, le=3600,
        description="a server pulls a stream while it holds its lease (renewed every third of this); another takes it after",
    )
    stream_max_attached_events: int = Field(
        1024, ge=16, le=1_000_000, description="events waiting for a client attached to a stream; one further behind is closed"
    )
    webhook_timeout_s: float = Field(10.0, gt=0, le=300, description="a webhook not answered by then is tried again")
    webhook_max_age_s: float = Field(
        86_400.0, gt=0, description="a delivery still failing this long after its event is given up"
    )
    webhook_max_retry_s: float = Field(
        300.0, ge=1, le=86_400, description="the longest wait between a delivery's tries (doubling from 1 s, with jitter)"
    )
    webhook_concurrency: int = Field(8, ge=1, le=1000, description="deliveries in flight at once")
    mqtt_url: str | None = Field(None, description="the MQTT broker streams publish to: mqtt://[user:password@]host[:port]")
    mqtt_discovery_prefix: str = Field(
        "homeassistant", min_length=1, max_length=200, description="Home Assistant's MQTT discovery prefix"
    )

    # Access control (off when api_keys is empty).
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="keys a client must present (Bearer, X-API-Key, subprotocol or ?api_key=), comma-separated",
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="browser origins allowed to connect, comma-separated (empty: any; no Origin: always)",
    )

    @field_validator("openai_session_headers")
    @classmethod
    def _header_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
                raise ValueError(f"not an HTTP header name: {name!r}")
        return names

    @field_validator("openai_urls", "api_keys", "allowed_origins", "openai_session_headers", "webrtc_ice_servers",
                     mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        """A flag or environment variable gives a comma-separated string (or a JSON list)."""
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                return json.loads(value)
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if self.ssl_certfile is None and (self.ssl_keyfile is not None or self.ssl_keyfile_password is not None):
            raise ValueError("ssl_keyfile and ssl_keyfile_password need ssl_certfile")
        return self

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        """A flag or environment variable gives the engine arguments as a JSON object."""
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value
