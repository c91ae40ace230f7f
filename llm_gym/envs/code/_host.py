"""What the sandbox's child needs on this machine: the interpreter and what it may read.

Found once per process by starting the interpreter with the sandbox's flags and reading its
``sys.path`` and memory maps; the Landlock rules and the audit hook's read paths come from here.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

from llm_gym.envs.code._process import minimal_env

__all__ = ["interpreter", "read_rules"]

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
                if child not in _SKIPPED_STDLIB_ENTRIES:
                    read_dirs.add(os.path.join(spelling, child))
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
