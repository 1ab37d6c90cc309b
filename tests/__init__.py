"""The livesight test suite: the first folder is the tier (core, session, socket, heavy), the folders under it mirror the source (see conftest.py)."""
