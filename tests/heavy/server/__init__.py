"""The server process under load, fuzz, a fresh boot, HAProxy, and the trained colours model on every engine."""
