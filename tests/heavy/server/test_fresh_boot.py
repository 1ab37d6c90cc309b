"""A machine just booted: the monotonic clock a few seconds from zero (a time namespace set back
with ``unshare --time``), and the core tier, the memory tests (server/process_memory.py) among it, run
under it.

``time.monotonic()`` counts from boot, so code that takes 0.0 for "never" passes on a machine
up for hours and fails on one up for seconds (MemoryReturn once skipped its first trim so).
CI runs the suite as root with util-linux: without unshare, or not as root, this fails rather
than skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: How long ago the namespace's machine booted, as its processes start.
BOOTED_S_AGO = 2
#: The memory test that a clock near zero once broke; it must run in the booted tier.
MEMORY_TEST = ("tests.core.server.test_process_memory", "test_trims_while_sessions_remain_at_most_once_per_interval")

# In the namespace: print the clock, then become the pytest run (same process, same clock).
PROBE_THEN_RUN = """
import os, sys, time
print(f"monotonic {time.monotonic():.3f}", flush=True)
os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])
"""


def just_booted() -> list[str]:
    """The command prefix that runs a program with the monotonic clock ``BOOTED_S_AGO`` from zero."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare is not installed (Debian: apt-get install util-linux)")
    if os.geteuid() != 0:
        pytest.fail("unshare --time needs root (CI runs the suite as root)")
    up = min(float(Path("/proc/uptime").read_text().split()[0]), time.monotonic())
    return [unshare, "--time", "--fork", f"--monotonic=-{max(0, int(up) - BOOTED_S_AGO)}"]


def test_the_clock_in_the_namespace_is_that_of_a_fresh_boot() -> None:
    """A process in the namespace reads time.monotonic() as a few seconds."""
    probe = subprocess.run(
        [*just_booted(), sys.executable, "-c", "import time; print(time.monotonic())"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert 0 < float(probe.stdout) < BOOTED_S_AGO + 10, probe.stdout


@pytest.mark.timeout(900)
def test_the_core_tier_and_the_memory_tests_pass_just_after_boot(tmp_path: Path) -> None:
    """The core tier, memory tests included, passes with the monotonic clock seconds from boot."""
    report = tmp_path / "core.xml"
    run = subprocess.run(
        [*just_booted(), sys.executable, "-c", PROBE_THEN_RUN,
         "-q", "-p", "no:cacheprovider", "-m", "core", f"--junitxml={report}"],
        cwd=ROOT, capture_output=True, text=True, timeout=800,
    )
    first, _, rest = run.stdout.partition("\n")
    assert first.startswith("monotonic "), run.stdout[-3000:] + run.stderr[-3000:]
    assert float(first.split()[1]) < BOOTED_S_AGO + 10, first
    assert run.returncode == 0, rest[-6000:] + run.stderr[-3000:]
    cases = {(c.get("classname"), c.get("name")): c for c in ET.parse(report).iter("testcase")}
    assert MEMORY_TEST in cases, "the memory tests left the core tier: run them here another way"
    assert not list(cases[MEMORY_TEST]), ET.tostring(cases[MEMORY_TEST], encoding="unicode")  # no failure or skip
