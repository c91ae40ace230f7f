"""The key/value budget maths: buffer shapes on hand-computed sizes, and the default budget from
the container's cgroup memory limit (v2 and v1, on fake cgroup trees)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from llm_gym.policies import kv_budget
from llm_gym.policies.kv_budget import buffer_shape, cgroup_memory_limit, default_kv_budget

V1_NO_LIMIT = "9223372036854771712"
GIB = 1 << 30


def _tree(root: Path, proc: str | None, files: dict[str, str]) -> Path:
    """A fake file system: ``proc/self/cgroup`` holding ``proc``, and ``files`` under
    ``sys/fs/cgroup``."""
    if proc is not None:
        (root / "proc" / "self").mkdir(parents=True)
        (root / "proc" / "self" / "cgroup").write_text(proc)
    for name, text in files.items():
        path = root / "sys" / "fs" / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("rows", "width", "limit", "expected"),
    [
        (1, 1, None, (1, 256)),  # at least MIN_WIDTH columns, rows a power of two
        (5, 300, None, (8, 512)),
        (5, 300, 8 * 513 * 4, (8, 512)),  # the rounded shape fits exactly
        (5, 300, 8 * 513 * 4 - 1, (5, 512)),  # 8 rows do not fit: the 5 live ones do
        (5, 300, 5 * 401 * 4, (5, 400)),  # 512 columns do not fit: the 400 that do
        (5, 300, 5 * 301 * 4, (5, 300)),  # exactly the live shape
        (5, 300, 5 * 301 * 4 - 1, (5, 300)),  # the live shape alone is over: it, no more
    ],
)
def test_buffer_shape(rows, width, limit, expected) -> None:
    assert buffer_shape(rows, width, 4, limit) == expected
    got_rows, got_width = expected
    if limit is not None and rows * (width + 1) * 4 <= limit:
        assert got_rows * (got_width + 1) * 4 <= limit


def test_cgroup_v2_limit_of_the_process_cgroup_and_its_ancestors(tmp_path) -> None:
    root = _tree(
        tmp_path,
        "0::/kubepods/pod1/box\n",
        {
            "memory.max": "max",
            "kubepods/memory.max": str(64 * GIB),
            "kubepods/pod1/memory.max": str(6 * GIB),
            "kubepods/pod1/box/memory.max": "max",
        },
    )
    assert cgroup_memory_limit(root) == 6 * GIB


def test_cgroup_v2_namespace_root_and_no_limit(tmp_path) -> None:
    # A container sees its own cgroup as the root: the path in proc does not exist under it.
    limited = _tree(tmp_path / "a", "0::/../../session-3.scope\n", {"memory.max": "4294967296\n"})
    assert cgroup_memory_limit(limited) == 4 * GIB
    unlimited = _tree(tmp_path / "b", "0::/\n", {"memory.max": "max\n"})
    assert cgroup_memory_limit(unlimited) is None


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path) -> None:
    proc = "9:pids:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n"
    limited = _tree(
        tmp_path / "a",
        proc,
        {
            "memory/memory.limit_in_bytes": V1_NO_LIMIT,
            "memory/process_api/abc/memory.limit_in_bytes": str(3 * GIB),
        },
    )
    assert cgroup_memory_limit(limited) == 3 * GIB
    unlimited = _tree(
        tmp_path / "b",
        proc,
        {
            "memory/memory.limit_in_bytes": V1_NO_LIMIT,
            "memory/process_api/abc/memory.limit_in_bytes": V1_NO_LIMIT,
        },
    )
    assert cgroup_memory_limit(unlimited) is None


def test_cgroup_limit_absent_or_unreadable(tmp_path) -> None:
    assert cgroup_memory_limit(tmp_path) is None  # no proc, no cgroup file system
    garbage = _tree(tmp_path / "g", "not a cgroup line\n", {"memory.max": "lots\n"})
    assert cgroup_memory_limit(garbage) is None
    zero = _tree(tmp_path / "z", None, {"memory/memory.limit_in_bytes": "0"})
    assert cgroup_memory_limit(zero) is None


def test_default_budget_is_an_eighth_of_the_container_limit_below_the_machine(
    monkeypatch,
) -> None:
    cpu = SimpleNamespace(type="cpu")
    page, pages = 4096, 16 * GIB // 4096  # a 16 GiB machine
    monkeypatch.setattr(
        kv_budget.os, "sysconf", lambda name: page if name == "SC_PAGE_SIZE" else pages
    )
    monkeypatch.setattr(kv_budget, "cgroup_memory_limit", lambda: 4 * GIB)
    assert default_kv_budget(cpu) == GIB // 2
    monkeypatch.setattr(kv_budget, "cgroup_memory_limit", lambda: 64 * GIB)
    assert default_kv_budget(cpu) == 2 * GIB  # a limit above the machine's memory
    monkeypatch.setattr(kv_budget, "cgroup_memory_limit", lambda: None)
    assert default_kv_budget(cpu) == 2 * GIB

    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(kv_budget.os, "sysconf", unknown)
    assert default_kv_budget(cpu) == 2 * GIB  # neither known: 2 GiB
    monkeypatch.setattr(kv_budget, "cgroup_memory_limit", lambda: 8 * GIB)
    assert default_kv_budget(cpu) == GIB
