"""GGUF files as ordinary HF folders, converted once into the model cache.

transformers reads a GGUF file (with the ``gguf`` package) but ``save_pretrained`` refuses the
model it loads; :func:`convert_gguf` loads the dequantized weights into a model built from the
file's config and saves that: ``model.safetensors`` (fp32: a dequantized GGUF's values are not
all bf16 values), ``tokenizer.json`` with the file's chat template, ``config.json`` and
``generation_config.json``. The folder loads with ``from_pretrained`` and without ``gguf``.

The cache is ``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``). A folder is complete
when its ``build_info.json`` names the same source and :data:`CONVERSION_VERSION` and its files
have their recorded sizes. A conversion is written into a temporary folder (``build_info.json``
last) that is renamed into place, so a folder is complete the moment it appears and an
interrupted conversion leaves nothing behind; a folder without a ``build_info.json`` of ours is
never replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, loads_json, open_input, read_input_text
from llm_gym.errors import InvalidArgumentError, LlmGymError

__all__ = [
    "CONVERSION_VERSION",
    "cache_lock",
    "cache_root",
    "convert_gguf",
    "ensure_converted",
    "is_complete",
    "log",
    "read_build_info",
    "replaceable",
    "require_gguf",
    "sha256_file",
]

CONVERSION_VERSION = "1"
"""Bumped whenever the conversion's output changes: a folder of another version is redone."""

BUILD_INFO = "build_info.json"

_CHUNK = 1 << 20


def log(message: str) -> None:
    """One line on stderr, as the model builds write them."""
    print(f"[llm_gym.models] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``), a folder or a path that
    can become one.

    Raises:
        InvalidArgumentError: The path, or a folder on the way to it, is something else (a
            file, a device).
    """
    root = os.environ.get("LLM_GYM_CACHE") or "~/.cache/llm_gym"
    path = Path(root).expanduser() / "models"
    for part in (path, *path.parents):  # the deepest that exists must be a folder
        if part.exists():
            if not part.is_dir():
                where = "is" if part == path else f"lies under {str(part)!r}, which is"
                raise InvalidArgumentError(
                    f"the model cache {str(path)!r} {where} not a folder; set LLM_GYM_CACHE "
                    "to a folder (or a path where one can be made)."
                )
            break
    return path


MAX_MODEL_FILE_BYTES = 1 << 40
"""The largest model file (``.gguf``, wheel) read: a terabyte, past the largest published."""


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The SHA-256 of the regular file at ``path`` (at most :data:`MAX_MODEL_FILE_BYTES`; a
    FIFO or a device is refused, :func:`~llm_gym.core.input_files.open_input`), read in 1 MiB
    chunks."""
    digest = hashlib.sha256()
    limit = InputLimit(
        "model file", MAX_MODEL_FILE_BYTES, "llm_gym.policies.gguf.MAX_MODEL_FILE_BYTES"
    )
    with open_input(path, limit) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


# --- the cache's folders --------------------------------------------------------------------


MAX_BUILD_INFO_BYTES = 1 << 20
"""The largest ``build_info.json`` read (the cache writes a few hundred bytes)."""


def read_build_info(folder: Path) -> dict[str, Any] | None:
    """The ``build_info.json`` of a cached model folder; None when there is none, or it is not
    a regular file of at most :data:`MAX_BUILD_INFO_BYTES` holding a JSON object."""
    name = "llm_gym.policies.gguf.MAX_BUILD_INFO_BYTES"
    try:
        limit = InputLimit("build record", MAX_BUILD_INFO_BYTES, name)
        info = loads_json(read_input_text(folder / BUILD_INFO, limit))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_complete(folder: Path, source: dict[str, Any]) -> bool:
    """Whether ``folder`` holds a finished conversion of ``source`` whose files are all there
    at their recorded sizes."""
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
            if (folder / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def replaceable(folder: Path) -> bool:
    """A folder is replaced only when it is one of our conversions (its build_info says so)."""
    if not folder.exists():
        return True
    info = read_build_info(folder)
    return folder.is_dir() and info is not None and "conversion_version" in info


def _move_into_place(tmp_dir: Path, target: Path) -> None:
    """Rename ``tmp_dir`` to ``target``; a folder already there is moved aside first and put
    back when the rename fails."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
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


@contextlib.contextmanager
def cache_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``target``'s conversion (``.NAME.lock`` beside it): processes
    that fetch or convert the same model at once (every rank of an ``accelerate launch``) take
    turns, and the ones after the first find the folder complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --- conversion -----------------------------------------------------------------------------


def require_gguf() -> None:
    """Raise a clear error when the ``gguf`` package is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise LlmGymError(
            "reading a GGUF file needs the gguf package: pip install 'llm-gym[gguf]' "
            "(or pip install gguf)."
        ) from None


def _convert_into(gguf_file: Path, out_dir: Path) -> None:
    """Write the HF folder of ``gguf_file`` into ``out_dir``: the dequantized weights loaded
    into a model built from the file's config (``save_pretrained`` refuses a GGUF-loaded
    model), and the file's tokenizer with its chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        settings.pop(key, None)
    config = type(loaded.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    context = getattr(config, "max_position_embeddings", None)
    if isinstance(context, int) and context > 0:
        tokenizer.model_max_length = context
    if getattr(tokenizer, "pad_token_id", None) is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        log(f"warning: {gguf_file.name} carries no chat template; chats need one")


def _convert_locked(gguf_file: Path, target: Path, source: dict[str, Any]) -> None:
    """Convert into a temporary folder renamed over ``target`` (under :func:`cache_lock`)."""
    if not replaceable(target):
        raise InvalidArgumentError(
            f"{target} exists and is not a converted model (no build_info.json of ours); "
            "move it away or set LLM_GYM_CACHE to another folder."
        )
    require_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    start = time.perf_counter()
    try:
        log(f"converting {gguf_file.name} into {target}")
        _convert_into(gguf_file, tmp_dir)
        umask = os.umask(0o022)
        os.umask(umask)
        tmp_dir.chmod(0o777 & ~umask)
        files = {}
        for file in sorted(tmp_dir.iterdir()):
            file.chmod(0o666 & ~umask)
            files[file.name] = file.stat().st_size
        info = {
            "source": source,
            "conversion_version": CONVERSION_VERSION,
            "files": files,
            "convert_seconds": round(time.perf_counter() - start, 2),
        }
        record = tmp_dir / BUILD_INFO
        record.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        record.chmod(0o666 & ~umask)
        _move_into_place(tmp_dir, target)  # complete the moment it appears
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    log(f"converted in {info['convert_seconds']:.1f}s: {target}")


def ensure_converted(
    gguf_file: Path,
    target: Path,
    source: dict[str, Any],
    *,
    force: bool = False,
    lock: bool = True,
) -> Path:
    """``target`` holding the conversion of ``gguf_file`` (recorded as ``source``): as it is when
    complete (unless ``force``), else converted anew, under :func:`cache_lock` (``lock=False``:
    the caller holds it)."""
    if not force and is_complete(target, source):
        return target
    with cache_lock(target) if lock else contextlib.nullcontext():
        if not force and is_complete(target, source):  # another process converted it meanwhile
            return target
        _convert_locked(gguf_file, target, source)
    return target


def convert_gguf(
    gguf_file: str | os.PathLike[str], output_dir: str | None = None, *, force: bool = False
) -> Path:
    """The HF folder of a local GGUF file, converted once.

    Args:
        gguf_file: A ``.gguf`` file (any architecture transformers reads from GGUF).
        output_dir: Where to convert (default: ``$LLM_GYM_CACHE/models/gguf-<sha256[:16]>``).
        force: Convert again even when the folder holds a complete conversion.

    Returns:
        The folder (``from_pretrained`` loads it; ``build_info.json`` records the source).

    Raises:
        InvalidArgumentError: ``gguf_file`` is not a regular ``.gguf`` file, or the output
            folder holds something other than a conversion.
        LlmGymError: The ``gguf`` package is not installed.
    """
    path = Path(gguf_file).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise InvalidArgumentError(f"expected a regular .gguf file, got {str(gguf_file)!r}.")
    digest = _file_digest(path)
    target = Path(output_dir) if output_dir else cache_root() / f"gguf-{digest[:16]}"
    source = {"gguf_sha256": digest}
    return ensure_converted(path.absolute(), target.expanduser().absolute(), source, force=force)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    """:func:`sha256_file`, remembered per file and its size and modification time: a loader
    that resolves the same file again does not read it again."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]
