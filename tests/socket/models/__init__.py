"""Tests of server/models: the generated tiny model."""
