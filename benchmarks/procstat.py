"""A child process's resources from ``/proc`` (Linux): resident memory and CPU time, for the
load tests (``serve_load``, ``remote_env``)."""

from __future__ import annotations

import os

__all__ = ["cpu_seconds", "rss_mib"]


def rss_mib(pid: int) -> float | None:
    """A process's resident memory in MiB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
