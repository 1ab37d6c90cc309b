"""The session core: every decision of a session, pure (no I/O, no anyio, no engine)."""
