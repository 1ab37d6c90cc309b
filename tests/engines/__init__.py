"""Tests of server/engines: the transformers engine, vLLM in process and over its OpenAI server."""
