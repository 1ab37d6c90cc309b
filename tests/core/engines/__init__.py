"""Tests of server/engines with no model: the model thread, the detokenizer."""
