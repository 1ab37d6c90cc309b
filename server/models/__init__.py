"""Tiny generated models for tests and the demo (nothing is downloaded)."""
