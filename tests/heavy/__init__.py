"""The heavy tier: vLLM, Chromium, Debian tools, load and fuzz runs, anything over ~20 s."""
