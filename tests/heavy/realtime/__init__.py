"""Tests of handlers/realtime that need more than the socket tier: other versions of the openai SDK."""
