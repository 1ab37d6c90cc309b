"""Tests of server/models: the shipped colours and demo models, and the demo model's training retraced."""
