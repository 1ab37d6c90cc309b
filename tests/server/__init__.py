"""Tests of the server process: the real app over a real socket, settings, auth, metrics, logs, memory, drain, docs."""
