"""Tests of handlers/core: the pure session core, driven by events without socket, engine or clock."""
