"""The socket tier: the real app over a real socket on port 0, or the real engine (torch, a
generated tiny model, a `livesight serve` child)."""
