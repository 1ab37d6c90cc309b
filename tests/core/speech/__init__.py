"""Tests of the voice pieces with no socket: sentence splitting, WAV and resampling, turn detection, the core's voice decisions."""
