"""Tests of the voice pieces (server/speech, handlers/session/voice) and voice over the wire."""
