"""The decode engine's key/value budget maths: how large the row buffers are, and how many bytes
they may take when the caller sets no budget.

Pure functions (the default budget reads the machine, through :func:`cgroup_memory_limit` and
``os.sysconf``), tested on hand-computed shapes and on fake cgroup trees.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "MIN_WIDTH",
    "UNLIMITED",
    "buffer_shape",
    "cgroup_memory_limit",
    "default_kv_budget",
]

MIN_WIDTH = 256
"""Fewest columns a row buffer is allocated with, when the budget allows them."""

UNLIMITED = 1 << 62
"""A cgroup limit at or above this many bytes means no limit (cgroup v1 writes "no limit" as
``PAGE_COUNTER_MAX`` pages, 9223372036854771712 bytes with 4 KiB pages)."""


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def buffer_shape(
    rows: int, width: int, column_bytes: int, limit: int | None, min_width: int = MIN_WIDTH
) -> tuple[int, int]:
    """The ``(rows, columns)`` to allocate row buffers with, for ``rows`` live rows of at most
    ``width`` columns each (one scratch column more is allocated on every row and counted).

    Both sizes rounded up to a power of two (columns to at least ``min_width``), so that buffers
    grow rarely, when that shape fits in ``limit`` bytes; otherwise ``rows`` exactly, with as
    many columns as fit (never fewer than ``width``: over ``limit`` only when ``rows`` rows of
    ``width`` columns alone are).

    Args:
        rows: Live rows (at least 1).
        width: Columns the widest live row holds.
        column_bytes: Bytes of one column of one row (keys and values of every layer).
        limit: The byte budget (None: no budget).
        min_width: Fewest columns of a rounded shape.

    Example:
        >>> buffer_shape(3, 300, 10, None)  # 4 rows of 512 (+1 scratch) columns
        (4, 512)
        >>> buffer_shape(3, 300, 10, 4 * 513 * 10 - 1)  # 4 rows do not fit: 3 rows
        (3, 512)
        >>> buffer_shape(3, 300, 10, 3 * 401 * 10)  # 512 columns do not fit: all that do
        (3, 400)
        >>> buffer_shape(3, 300, 10, 100)  # over the budget only when the live rows are
        (3, 300)
    """
    rounded_rows = _power_of_two(rows)
    rounded_width = max(min_width, _power_of_two(width))
    if limit is None or rounded_rows * (rounded_width + 1) * column_bytes <= limit:
        return rounded_rows, rounded_width
    fitting = limit // (rows * column_bytes) - 1
    return rows, max(width, min(rounded_width, fitting))


def _limit_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.isdigit():  # "max" (cgroup v2: no limit) or unreadable content
        return None
    value = int(text)
    return value if 0 < value < UNLIMITED else None


def cgroup_memory_limit(root: str | os.PathLike[str] = "/") -> int | None:
    """The memory limit of the control group this process runs in: the smallest limit set on
    its cgroup or any ancestor, cgroup v2 (``memory.max``) or v1 (``memory.limit_in_bytes``);
    None when none is set or none can be read (no cgroup file system, another OS).

    The process's cgroup paths come from ``proc/self/cgroup``; a container usually mounts its
    own cgroup as the file system's root, so each path is also tried by its ancestors.

    Args:
        root: The file system root the ``proc`` and ``sys/fs/cgroup`` folders are read under.
    """
    base = Path(root)
    cgroups = base / "sys" / "fs" / "cgroup"
    try:
        lines = (base / "proc" / "self" / "cgroup").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    places = [(cgroups, "/", "memory.max"), (cgroups / "unified", "/", "memory.max")]
    places.append((cgroups / "memory", "/", "memory.limit_in_bytes"))
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # cgroup v2's unified hierarchy
            places += [(cgroups, path, "memory.max"), (cgroups / "unified", path, "memory.max")]
        elif "memory" in controllers.split(","):
            places.append((cgroups / "memory", path, "memory.limit_in_bytes"))
    limits = []
    for mount, path, name in places:
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for depth in range(len(parts), -1, -1):
            limit = _limit_file(mount.joinpath(*parts[:depth], name))
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def default_kv_budget(device: Any) -> int:
    """The rows' key/value budget when none is given: on a CPU, an eighth of the memory this
    process may use (the container's cgroup limit where one is set and below the machine's
    memory; the model, a trainer's optimizer and the episodes need the rest), 2 GiB when neither
    can be read; on an accelerator a quarter of its free memory.

    The budget changes how rows are batched, never the random stream a seeded episode draws
    from (:func:`llm_gym.policies.hf_sampling.row_stream`).

    Args:
        device: A ``torch.device``.
    """
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return free // 4
    known = [m for m in (_physical_memory(), cgroup_memory_limit()) if m]
    return min(known) // 8 if known else 2 << 30
