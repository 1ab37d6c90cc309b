"""The browser client (static/) in a real Chromium."""
