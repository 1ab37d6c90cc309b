"""Tests of handlers/realtime: the OpenAI Realtime endpoint through the real app."""
