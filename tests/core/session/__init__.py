"""Tests of handlers/session with no session running: the intake's budgets, admission and decode pool."""
