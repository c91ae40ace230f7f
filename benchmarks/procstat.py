"""The machine's and a process's facts from ``/proc`` (Linux): the CPU model and the flags that
decide its matmul kernels, how the machine's CPU time was spent during a run
(:class:`benchmarks.common.Conditions`), and a child process's resident memory and CPU time (the
load tests: ``serve_load``, ``remote_env``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence

__all__ = [
    "CPU_FLAGS",
    "cpu_flags",
    "cpu_model",
    "cpu_seconds",
    "cpu_shares",
    "cpu_times",
    "describe_flags",
    "flags_present",
    "machine_description",
    "rss_mib",
]

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The counters of ``/proc/stat``'s ``cpu`` line that :func:`cpu_times` reads, in its order."""


CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "fma")
"""The ``/proc/cpuinfo`` flags that decide how fast a matmul runs in each dtype: AMX tiles and
their bf16 instructions, AVX-512 with bf16 dot products, AVX-512, AVX2 and fused multiply-add.
Without ``amx_bf16`` or ``avx512_bf16`` a bf16 matmul has no native kernel and may run slower
than fp32."""


def _cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor or machine without it)."""
    for line in (_cpuinfo() or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def flags_present(cpuinfo: str, names: tuple[str, ...] = CPU_FLAGS) -> list[str]:
    r"""The flags among ``names`` that the first ``flags`` line of ``cpuinfo`` text lists, in the
    order of ``names``; none without a ``flags`` line.

    Example:
        >>> flags_present("processor\t: 0\nflags\t\t: fpu avx2 fma amx_tile avx512fp16\n")
        ['amx_tile', 'avx2', 'fma']
    """
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            listed = set(value.split())
            return [name for name in names if name in listed]
    return []


def cpu_flags(names: tuple[str, ...] = CPU_FLAGS) -> list[str] | None:
    """:func:`flags_present` on this machine's ``/proc/cpuinfo``; None without it."""
    text = _cpuinfo()
    return None if text is None else flags_present(text, names)


def describe_flags(flags: list[str], names: tuple[str, ...] = CPU_FLAGS) -> str:
    """The flags for a results file's header.

    Example:
        >>> describe_flags(["avx2", "fma"])
        'CPU flags: avx2, fma'
        >>> describe_flags([], ("amx_bf16", "avx512_bf16"))
        'CPU flags: none of amx_bf16, avx512_bf16'
    """
    return "CPU flags: " + (", ".join(flags) if flags else "none of " + ", ".join(names))


def machine_description() -> str:
    """CPU model, core count and Python version, for the header of a results file."""
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def cpu_times() -> list[int] | None:
    """The machine's CPU time so far, in clock ticks summed over its CPUs: ``/proc/stat``'s
    :data:`CPU_FIELDS` (a kernel without a counter reads 0 for it); None without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1 : 1 + len(CPU_FIELDS)]]
    return values + [0] * (len(CPU_FIELDS) - len(values))


def cpu_shares(
    before: Sequence[int] | None, after: Sequence[int] | None
) -> dict[str, float] | None:
    """How the machine's CPU time between two :func:`cpu_times` readings was spent: ``busy``
    (user, nice, system, irq, softirq), ``idle`` (idle, iowait) and ``steal``, the time the
    hypervisor gave these CPUs to other guests. A busy host slows a run without showing in the
    load average; it shows here. None when a reading is missing or no time passed.

    Example:
        >>> cpu_shares([0] * 8, [50, 5, 10, 15, 5, 2, 3, 10])
        {'busy': 0.7, 'idle': 0.2, 'steal': 0.1}
    """
    if before is None or after is None:
        return None
    spent = dict(zip(CPU_FIELDS, (b - a for a, b in zip(before, after, strict=True)), strict=True))
    total = sum(spent.values())
    if total <= 0:
        return None
    busy = sum(spent[k] for k in ("user", "nice", "system", "irq", "softirq"))
    return {
        "busy": busy / total,
        "idle": (spent["idle"] + spent["iowait"]) / total,
        "steal": spent["steal"] / total,
    }


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
