"""The model cache's folders: where they are, whom they must belong to, the lock a conversion
holds, when a folder is complete, and the temporary folders a killed conversion leaves.

The cache is ``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``). A model folder in
it (or any output folder a user names) is trusted only when the current user (or root) owns it
and the folder that holds it: a conversion planted in a folder another user can write is
refused, never loaded. The model folder and its lock file (``.NAME.lock`` beside it) are never
followed through a symbolic link, and a model folder is complete only when its
``build_info.json`` names the same source and :data:`CONVERSION_VERSION` and its files are
regular files of their recorded sizes. Every refusal, and every path the system refuses
(a permission, a name too long, a NUL byte), is one :class:`~llm_gym.errors.InvalidArgumentError`
that names the path and the remedy.

Temporary folders (``.NAME.tmp-*``, ``.NAME.src-*``, ``.NAME.old-*``, ``.NAME.fetch-*``) are
made only under the model's lock, so any found while the lock is held belong to a process that
died mid-way: :func:`cache_lock` removes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, loads_json, read_input_text
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "BUILD_INFO",
    "CONVERSION_VERSION",
    "TEMP_KINDS",
    "cache_lock",
    "cache_root",
    "check_model_folder",
    "is_complete",
    "log",
    "move_into_place",
    "read_build_info",
    "replaceable",
    "sweep_stale",
    "temp_folder",
]

CONVERSION_VERSION = "1"
"""Bumped whenever the conversion's output changes: a folder of another version is redone."""

BUILD_INFO = "build_info.json"

TEMP_KINDS = ("tmp", "src", "old", "fetch")
"""The temporary folders beside a model folder ``NAME``: ``.NAME.<kind>-*`` (a conversion's
output, its staged source file, the folder it replaces, a fetch's download)."""

REMEDY = "set LLM_GYM_CACHE (or the output folder) to a folder of yours"

MAX_BUILD_INFO_BYTES = 1 << 20
"""The largest ``build_info.json`` read (the cache writes a few hundred bytes)."""


def log(message: str) -> None:
    """One line on stderr, as the model builds write them."""
    print(f"[llm_gym.models] {message}", file=sys.stderr, flush=True)


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def cache_root() -> Path:
    """``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``), a folder or a path that
    can become one.

    Raises:
        InvalidArgumentError: The path, or a folder on the way to it, is something else (a
            file, a device), or the system refuses the path (a NUL byte, a name too long).
    """
    root = os.environ.get("LLM_GYM_CACHE") or "~/.cache/llm_gym"
    path = Path(root).expanduser() / "models"
    for part in (path, *path.parents):  # the deepest that exists must be a folder
        try:
            exists = part.exists()
            is_dir = exists and part.is_dir()
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the model cache {str(path)!r} is not a path the system takes ({_reason(exc)}); "
                "set LLM_GYM_CACHE to a folder (or a path where one can be made)."
            ) from None
        if exists:
            if not is_dir:
                where = "is" if part == path else f"lies under {str(part)!r}, which is"
                raise InvalidArgumentError(
                    f"the model cache {str(path)!r} {where} not a folder; set LLM_GYM_CACHE "
                    "to a folder (or a path where one can be made)."
                )
            break
    return path


def _trusted_owner(info: os.stat_result, path: Path, what: str) -> None:
    """Refuse ``path`` when neither the current user nor root owns it (no check where the
    system has no user ids)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and info.st_uid not in (uid, 0):
        raise InvalidArgumentError(
            f"the {what} {str(path)!r} belongs to another user (uid {info.st_uid}); a folder "
            f"another user can change is not trusted: {REMEDY}."
        )


def _lstat(path: Path, what: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"cannot read the {what} {str(path)!r}: {_reason(exc)}; {REMEDY}."
        ) from None


def check_model_folder(target: Path) -> None:
    """Refuse a model folder that is a symbolic link, not a folder, or another user's (a path
    where none exists yet passes).

    Raises:
        InvalidArgumentError: One line naming the folder and the remedy.
    """
    info = _lstat(target, "model folder")
    if info is None:
        return
    if stat.S_ISLNK(info.st_mode):
        raise InvalidArgumentError(
            f"the model folder {str(target)!r} is a symbolic link; the model cache follows none: "
            f"remove it, or {REMEDY}."
        )
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidArgumentError(
            f"the model folder {str(target)!r} is not a folder; move it away, or {REMEDY}."
        )
    _trusted_owner(info, target, "model folder")


def _cache_folder(folder: Path) -> Path:
    """``folder`` (the one that holds model folders), made when missing and checked to be a
    folder the current user (or root) owns."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        info = os.stat(folder)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(
            f"cannot make the model cache folder {str(folder)!r}: {_reason(exc)}; {REMEDY}."
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidArgumentError(f"the model cache {str(folder)!r} is not a folder; {REMEDY}.")
    _trusted_owner(info, folder, "model cache folder")
    return folder


def _lock_file(lock: Path) -> None:
    """Make the lock file (never through a link) and refuse one that is a link, not a regular
    file, or another user's."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(lock, flags, 0o644)
    except (OSError, ValueError) as exc:
        info = _lstat(lock, "lock file")
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise InvalidArgumentError(
                f"the lock file {str(lock)!r} is a symbolic link; the model cache follows none: "
                f"remove it, or {REMEDY}."
            ) from None
        raise InvalidArgumentError(
            f"cannot open the lock file {str(lock)!r}: {_reason(exc)}; {REMEDY}."
        ) from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidArgumentError(
            f"the lock file {str(lock)!r} is not a regular file; remove it, or {REMEDY}."
        )
    _trusted_owner(info, lock, "lock file")


def sweep_stale(target: Path) -> list[Path]:
    """Remove the temporary folders of ``target`` (:data:`TEMP_KINDS`) that are the current
    user's folders (not links); call it holding :func:`cache_lock`. Returns what it removed."""
    prefixes = tuple(f".{target.name}.{kind}-" for kind in TEMP_KINDS)
    removed = []
    for entry in os.scandir(target.parent):
        if not entry.name.startswith(prefixes) or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        with contextlib.suppress(InvalidArgumentError):
            _trusted_owner(entry.stat(follow_symlinks=False), path, "temporary folder")
            shutil.rmtree(path, ignore_errors=True)
            log(f"removed {path.name}, left by a conversion that did not finish")
            removed.append(path)
    return removed


@contextlib.contextmanager
def cache_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``target``'s conversion (``.NAME.lock`` beside it, a
    ``filelock.FileLock``): processes that fetch or convert the same model at once (every rank
    of an ``accelerate launch``) take turns, and the ones after the first find the folder
    complete. Holding it, the folders are checked (:func:`check_model_folder`, the folder that
    holds it) and stale temporary folders removed (:func:`sweep_stale`).

    Raises:
        InvalidArgumentError: A folder or the lock file is refused (see the module).
    """
    from filelock import FileLock

    folder = _cache_folder(target.parent)
    lock = folder / f".{target.name}.lock"
    _lock_file(lock)
    with FileLock(str(lock)):
        check_model_folder(target)
        sweep_stale(target)
        yield


def temp_folder(target: Path, kind: str) -> Path:
    """A new temporary folder ``.NAME.<kind>-*`` beside ``target`` (``kind`` one of
    :data:`TEMP_KINDS`), made under :func:`cache_lock` so that a later holder can sweep it."""
    if kind not in TEMP_KINDS:
        raise InvalidArgumentError(f"kind must be one of {TEMP_KINDS}, actual value: {kind!r}.")
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-", dir=target.parent))


def read_build_info(folder: Path) -> dict[str, Any] | None:
    """The ``build_info.json`` of a cached model folder; None when there is none, or it is not
    a regular file of at most :data:`MAX_BUILD_INFO_BYTES` holding a JSON object."""
    name = "llm_gym.policies.model_cache.MAX_BUILD_INFO_BYTES"
    try:
        limit = InputLimit("build record", MAX_BUILD_INFO_BYTES, name)
        info = loads_json(read_input_text(folder / BUILD_INFO, limit))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_complete(folder: Path, source: dict[str, Any]) -> bool:
    """Whether ``folder`` holds a finished conversion of ``source`` whose files are all there,
    regular files (no links) at their recorded sizes."""
    info = read_build_info(folder)
    if info is None or info.get("source") != source:
        return False
    if info.get("conversion_version") != CONVERSION_VERSION:
        return False
    files = info.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return False
    for name, size in files.items():
        try:
            found = os.lstat(folder / name)
        except (OSError, ValueError):
            return False
        if not stat.S_ISREG(found.st_mode) or found.st_size != size:
            return False
    return True


def replaceable(folder: Path) -> bool:
    """A folder is replaced only when it is one of our conversions (its build_info says so)."""
    if not folder.exists():
        return True
    info = read_build_info(folder)
    return folder.is_dir() and info is not None and "conversion_version" in info


def move_into_place(tmp_dir: Path, target: Path) -> None:
    """Rename ``tmp_dir`` to ``target``; a folder already there is moved aside first and put
    back when the rename fails."""
    old = None
    if target.exists():
        old = temp_folder(target, "old")
        os.rename(target, old / "build")
    try:
        os.rename(tmp_dir, target)
    except BaseException:
        if old is not None:
            os.rename(old / "build", target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
