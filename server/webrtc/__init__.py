"""WebRTC calls: OpenAI's ``/v1/realtime/calls`` interface over the session core."""
