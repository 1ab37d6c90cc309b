"""Voice over the wire: recognition off the event loop, spoken questions through the real app."""
