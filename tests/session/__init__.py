"""The session tier: tests of handlers/session, the session adapter with scripted engines over an in-memory transport."""
