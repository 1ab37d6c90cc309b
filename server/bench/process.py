"""What a process costs, read from Linux /proc: CPU time (of a process, its threads, its
tree), resident memory and memory in transparent huge pages.

Every function takes a pid; a process or thread that ends while it is read counts as spent
nothing more (it is passed over).
"""

from __future__ import annotations

import os


def _stat_fields(path: str) -> list[str]:
    """The fields of a ``stat`` file after ``pid (comm)``: ``[state, ppid, ...]``, so utime
    and stime are 11 and 12. Raises ``OSError`` when the process or thread has ended."""
    with open(path) as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _tick_s() -> float:
    return 1 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) * _tick_s()


def thread_cpu_s(pid: int) -> dict[str, tuple[float, float]]:
    """User and system CPU seconds of each thread of a process, by thread id (the main
    thread's id is the pid)."""
    tick = _tick_s()
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
        out[tid] = (int(fields[11]) * tick, int(fields[12]) * tick)
    return out


def process_tree_cpu_s(root: int, descendants: bool = True) -> float:
    """User + system CPU seconds of ``root`` and (unless told not to) its live descendants."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(f"/proc/{entry}/stat")
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    tree, frontier = {root}, [root] if descendants else []
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(ticks.get(pid, 0) for pid in tree) * _tick_s()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process in bytes; 0 when it is not reported."""
    with open(f"/proc/{pid}/status") as status:
        return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)


def huge_page_bytes(pid: int) -> int:
    """Anonymous memory of a process backed by transparent huge pages, in bytes; 0 when it is
    not reported. Reading it takes the process's memory map lock: read it once, after a load."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            return next((int(line.split()[1]) * 1024 for line in rollup if line.startswith("AnonHugePages:")), 0)
    except OSError:
        return 0
