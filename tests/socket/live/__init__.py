"""Tests of handlers/live: the Gemini Live endpoint through the real app, over TLS."""
