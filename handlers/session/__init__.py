"""The adapter: one WebSocket session carried out with anyio (intake, answers, voice, resume)."""
