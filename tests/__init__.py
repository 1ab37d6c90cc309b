"""The livesight test suite: folders mirror the source, markers name the tier (see conftest.py)."""
