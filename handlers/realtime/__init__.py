"""The OpenAI Realtime protocol (GA shape) as a codec over the session core."""

from handlers.realtime.codec import RealtimeCodec

__all__ = ["RealtimeCodec"]
