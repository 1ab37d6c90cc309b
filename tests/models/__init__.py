"""Tests of server/models: the generated demo models."""
