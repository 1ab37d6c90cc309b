"""The Gemini Live codec (``BidiGenerateContent``) over the session core."""

from handlers.live.codec import LiveCodec

__all__ = ["LiveCodec"]
