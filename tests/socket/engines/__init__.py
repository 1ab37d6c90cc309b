"""Tests of server/engines through the real engine: the transformers engine's cache and checks, the warm prefix over the wire."""
