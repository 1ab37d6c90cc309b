"""Tests of handlers/live with no socket: the Gemini Live codec, bytes in, events out."""
