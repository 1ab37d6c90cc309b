"""The Python client of protocol v1: a typed connection, the resumable stream client, frame sources."""
