"""Tests of handlers/session through the real app: resume after a dropped connection."""
