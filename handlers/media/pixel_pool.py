"""Recycled pixel memory for decoded frames.

A 640x480 frame decodes into ~0.9 MB. Allocated fresh for every frame and freed when the
frame leaves its buffer, that memory went back to the kernel and came back as new pages:
with a hundred sessions streaming, three quarters of the decode threads' CPU was the
kernel's (page faults, zeroing, unmapping, TLB flushes), not decoding. ``PixelPool`` keeps
the memory of released frames (up to ``pixel_pool_bytes``) and hands it to the next decode
of the same size: in a steady stream every frame reuses the memory of the one it evicts.

Memory is only recycled when nothing else refers to it: ``give`` checks the reference
counts of the frame's array and of the buffer under it, so an image still used by a
prompt, the engine or a derived view is left to be freed normally.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

# References ``give`` sees to an unshared frame image: the caller's, its own parameter and
# ``getrefcount``'s argument; to the buffer under it: the image's ``base``, a local, the argument.
_UNSHARED_REFS = 3


class PixelPool:
    """Free pixel buffers by size, at most ``max_bytes`` in all (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0
        self.fresh = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A writable uint8 array of ``shape`` (contents undefined), recycled when one is free."""
        nbytes = 1
        for n in shape:
            nbytes *= n
        with self._lock:
            stack = self._free.get(nbytes)
            buffer = stack.pop() if stack else None
            if buffer is not None:
                self._bytes -= nbytes
                self.reused += 1
            else:
                self.fresh += 1
        if buffer is None:
            buffer = np.empty(nbytes, dtype=np.uint8)
        return buffer.reshape(shape)

    def give(self, image: object) -> bool:
        """Take back the memory of an image made by ``take`` once nothing else refers to it;
        True when it was kept for reuse (anything else is left alone)."""
        buffer = getattr(image, "base", None)
        if not isinstance(buffer, np.ndarray) or buffer.base is not None or buffer.ndim != 1:
            return False  # not one of ours
        if sys.getrefcount(image) > _UNSHARED_REFS or sys.getrefcount(buffer) > _UNSHARED_REFS:
            return False  # still in use somewhere: freed normally when that use ends
        with self._lock:
            if self._bytes + buffer.nbytes > self.max_bytes:
                return False
            self._free.setdefault(buffer.nbytes, []).append(buffer)
            self._bytes += buffer.nbytes
        return True

    def clear(self) -> None:
        """Drop every free buffer (their memory goes back to the allocator)."""
        with self._lock:
            self._free.clear()
            self._bytes = 0


#: The server's pool (sized by ``configure`` from the ``pixel_pool_bytes`` setting).
POOL = PixelPool(64 * 1024 * 1024)


def configure(max_bytes: int) -> None:
    """Set the pool's bound (call before the server starts)."""
    POOL.max_bytes = max_bytes
    if POOL.held_bytes > max_bytes:
        POOL.clear()
