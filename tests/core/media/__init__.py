"""Tests of handlers/media: decoding, similarity thumbnails, the pixel pool."""
