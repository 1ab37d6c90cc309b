"""Tests of server/client with no server: what the protocol client puts on the wire and how it reads events."""
