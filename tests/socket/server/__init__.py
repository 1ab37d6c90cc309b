"""The server process over a real socket: settings, auth, metrics, logs, drain, prompts, watches."""
