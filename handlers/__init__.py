"""One WebSocket session: protocol, buffers, filter, decoding, warmup and turns."""
