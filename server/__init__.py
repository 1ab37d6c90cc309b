"""livesight: a server that watches live video and answers questions about it."""
