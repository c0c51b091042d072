"""What ``/proc`` says about a process and about the machine, for the benches that measure other processes
(``bench/gateway.py``, ``bench/fleet.py``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["cpu_seconds", "load_average", "machine_ticks", "rss_bytes"]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, every thread of it; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, as proc(5) counts them).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """A process's resident memory (``VmRSS``); 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, every core."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def load_average() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])
