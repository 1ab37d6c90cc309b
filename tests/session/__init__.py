"""Tests of handlers/session: the session adapter with scripted engines, intake, resume."""
