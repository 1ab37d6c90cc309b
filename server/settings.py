"""All of livesight's settings in one object.

Every field can be given as a ``livesight serve`` flag (``--max-frame-bytes``) or as an
environment variable ``LIVESIGHT_<FIELD>`` (``LIVESIGHT_MAX_FRAME_BYTES``). No other module
reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


def default_cache_dir() -> Path:
    """Where the generated demo model lives unless ``cache_dir`` says otherwise."""
    return Path.home() / ".cache" / "livesight"


class Settings(BaseSettings):
    """Server settings. Limits are per session unless the description says otherwise."""

    model_config = SettingsConfigDict(env_prefix="LIVESIGHT_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 = any free port)")
    engine: Literal["transformers"] = Field("transformers", description="inference engine")
    model: str | None = Field(None, description="model path or id; none = the generated demo model")
    device: str = Field("cpu", description="torch device for the transformers engine (cpu, cuda, cuda:1)")
    dtype: str = Field("auto", description="model dtype: auto, float32, bfloat16, float16")
    trust_remote_code: bool = Field(False, description="allow model code shipped with the model")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="where the demo model is generated")
    log_level: str = Field("info", description="logging level")

    config_timeout_s: float = Field(10.0, gt=0, description="deadline for the first message")
    idle_timeout_s: float = Field(
        60.0, gt=0, description="close a session that sends nothing this long while no answer runs"
    )
    max_frame_bytes: int = Field(10 * MiB, ge=1024, description="largest video.frame payload (base64 text)")
    max_audio_bytes: int = Field(4 * MiB, ge=1024, description="largest buffered PCM audio per session")
    max_message_bytes: int = Field(16 * MiB, ge=1024, description="largest WebSocket message")
    max_queue: int = Field(200, ge=1, description="client messages read ahead per session")
    max_sessions: int = Field(64, ge=1, description="concurrent sessions; more are refused")
    max_image_side: int = Field(
        1024, ge=32, description="frames are decoded at most this large (the model may ask for less)"
    )
    decode_threads: int = Field(2, ge=1, le=64, description="threads for image decoding (whole server)")
    max_history_turns: int = Field(4, ge=0, le=64, description="previous answers kept in the prompt, as text")
    max_answer_tokens: int = Field(1024, ge=1, description="upper bound on sampling.max_tokens")
    max_cached_images: int = Field(
        128, ge=1, description="preprocessed images (pixel tensors) kept for re-prefill, whole server"
    )
    max_cached_tokens: int = Field(
        200_000, ge=1, description="KV-cache tokens kept across all sessions (least recently used are dropped)"
    )
