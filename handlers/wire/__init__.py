"""The wire: protocol v1's typed events, error codes, core commands and the codec interface."""
