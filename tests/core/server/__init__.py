"""Tests of the server process with no socket: the docs against the code, when freed memory goes back to the OS."""
