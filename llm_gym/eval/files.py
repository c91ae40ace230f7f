"""Result files (eval reports, leaderboards): written whole, or not at all.

:func:`write_atomic` writes a new file beside the old one and renames it over it, so a reader
(or a crash, or a full disk) never leaves half a file; :func:`write_target` says which file that
replaces: a symbolic link's target only when the link is the writer's own (a rename ignores the
kernel's ``protected_symlinks`` rule, which an ``open`` of someone else's link in ``/tmp`` obeys),
and never a directory, device or FIFO.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["write_atomic", "write_target"]


def _kind(path: Path) -> str:
    if path.is_dir():
        return "a directory"
    if path.is_char_device() or path.is_block_device():
        return "a device"
    return "a FIFO" if path.is_fifo() else "not a regular file"


def write_target(path: str | Path) -> Path:
    """The file a write to ``path`` replaces: ``path``, or its target for a link of one's own.

    Raises:
        PermissionError: ``path`` is a symbolic link that another user owns.
        OSError: what it names exists and is not a regular file (a directory, a device, a FIFO).
    """
    path = Path(path)
    if path.is_symlink():
        euid = os.geteuid() if hasattr(os, "geteuid") else None
        if euid is not None and os.lstat(path).st_uid != euid:
            raise PermissionError(f"{str(path)!r} is a symbolic link that another user owns")
        path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        raise OSError(f"{str(path)!r} is {_kind(path)}, not a regular file")
    return path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` through a new file in the same folder, synced and renamed over the old one:
    readers see the old file or the new one. The new file keeps the old one's permissions (a new
    path gets the umask's); missing folders are made. Returns the file written
    (:func:`write_target`, whose errors it raises)."""
    target = write_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
