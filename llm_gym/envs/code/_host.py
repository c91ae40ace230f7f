"""What the sandbox's child needs on this machine: the interpreter and what it may read.

Found once per process by starting the interpreter with the sandbox's flags and reading its
``sys.path`` and memory maps; the Landlock rules and the audit hook's read paths come from here.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
import tempfile

from llm_gym.envs.code._process import minimal_env

__all__ = ["interpreter", "read_rules", "unprivileged_ids"]

_SKIPPED_STDLIB_ENTRIES = frozenset({"site-packages", "dist-packages", "__pycache__"})


def interpreter() -> str:
    """The base interpreter (a virtualenv's python is only a link to it), resolved."""
    base = getattr(sys, "_base_executable", None)
    path = base if base and os.path.exists(base) else sys.executable
    return os.path.realpath(path)


_PROBE = (
    "import sys,json\n"
    "maps=[]\n"
    "try:\n"
    " maps=[l.split(None,5)[5].strip() for l in open('/proc/self/maps') if len(l.split())>5]\n"
    "except OSError: pass\n"
    "print(json.dumps({'path':sys.path,'maps':maps}))\n"
)


def _leads_elsewhere(path: str) -> bool:
    """A link to a folder outside the one it sits in: the audit hook compares paths as text, so
    ``link/secret`` would pass as inside while the kernel opens a file elsewhere."""
    if not os.path.islink(path) or not os.path.isdir(path):
        return False
    folder = os.path.realpath(os.path.dirname(path))
    return not os.path.realpath(path).startswith(folder + os.sep)


@functools.cache
def read_rules() -> dict[str, list[str]]:
    """What the child may read: stdlib entries (minus site-packages), its binary and libraries.

    Found once by starting the same interpreter with the same flags and reading its
    ``sys.path`` and memory maps.
    """
    python = interpreter()
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-B", "-c", _PROBE],
            capture_output=True,
            timeout=30,
            env=minimal_env(tempfile.gettempdir()),
            check=True,
        ).stdout
        probe = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        probe = {"path": [], "maps": []}
    read_dirs: set[str] = set()
    list_dirs: set[str] = set()
    read_files: set[str] = {python}
    for entry in probe["path"]:
        if not os.path.isdir(entry):
            continue
        # The path as imports spell it (the audit hook compares text) and its real path.
        for spelling in {os.path.abspath(entry), os.path.realpath(entry)}:
            list_dirs.add(spelling)
            for child in os.listdir(spelling):
                path = os.path.join(spelling, child)
                if child not in _SKIPPED_STDLIB_ENTRIES and not _leads_elsewhere(path):
                    read_dirs.add(path)
    stdlib_roots = tuple(list_dirs)
    for mapped in probe["maps"]:
        if not mapped.startswith("/") or not os.path.isfile(mapped):
            continue
        real = os.path.realpath(mapped)
        read_files.add(real)
        folder = os.path.dirname(real)
        # A system library folder (libc's) is readable whole, for extension modules' own
        # libraries; a folder that holds the standard library (libpython's) is not.
        if not any(root.startswith(folder + os.sep) for root in stdlib_roots):
            read_dirs.add(folder)
    if os.path.isfile("/etc/ld.so.cache"):
        read_files.add("/etc/ld.so.cache")
    return {
        "read_dirs": sorted(read_dirs),
        "list_dirs": sorted(list_dirs),
        "read_files": sorted(read_files),
    }


NOBODY = 65534
"""The uid and gid a root grader runs candidates as (``nobody``/``nogroup`` on Linux), unless
the password database names another ``nobody``."""


def _nobody() -> tuple[int, int]:
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
    except (ImportError, KeyError):
        return NOBODY, NOBODY
    return entry.pw_uid, entry.pw_gid


def _reachable_by_others(path: str) -> bool:
    """Whether any user may read ``path`` (and enter every folder above it)."""
    try:
        mode = os.stat(path).st_mode
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            return False
        parent = os.path.dirname(path)
        while parent != path:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            path, parent = parent, os.path.dirname(parent)
    except OSError:
        return False
    return True


@functools.cache
def unprivileged_ids() -> tuple[int, int, bool] | None:
    """``(uid, gid, keep_read_search)`` to run candidates as when this process is root, else
    ``None``.

    ``keep_read_search``: the interpreter or its standard library is not readable by other users
    (a ``/root/.pyenv`` interpreter), so the child keeps ``CAP_DAC_READ_SEARCH`` to read them.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    uid, gid = _nobody()
    rules = read_rules()
    needed = [interpreter(), *rules["list_dirs"], *rules["read_files"]]
    return uid, gid, not all(_reachable_by_others(path) for path in needed)
