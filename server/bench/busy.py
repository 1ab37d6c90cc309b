"""Other processes that keep cores busy while a benchmark runs (``--busy N``): a host whose
cores are shared with other work, as a small cloud machine or a laptop is.

Each is a plain Python process spinning ``while True: pass`` at normal priority; they stop
when the ``with`` block ends, whatever ends it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from server.bench.process import process_cpu_s

SPIN = "while True: pass"


@dataclass
class Spinners:
    """The spinning processes of a ``busy_cores`` block."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    def cpu_s(self) -> float:
        """CPU seconds they have used together (0 for one that has ended)."""
        total = 0.0
        for proc in self.procs:
            try:
                total += process_cpu_s(proc.pid)
            except OSError:
                pass  # it has ended: its time is no longer readable
        return total


@contextmanager
def busy_cores(count: int) -> Iterator[Spinners]:
    """Start ``count`` processes that spin on the CPU; stops (kills) them on exit."""
    spinners = Spinners()
    try:
        for _ in range(count):
            spinners.procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL))
        yield spinners
    finally:
        for proc in spinners.procs:
            proc.kill()
        for proc in spinners.procs:
            proc.wait()
