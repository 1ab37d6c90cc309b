"""Tests of server/engines on vLLM: in process, behind its OpenAI server, behind HAProxy."""
