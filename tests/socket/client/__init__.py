"""Tests of server/client: the protocol client, livesight stream, vLLM-Omni's example client, with the real server."""
