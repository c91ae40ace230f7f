"""GGUF files as ordinary HF folders, converted once into the model cache.

:func:`convert_gguf` loads a GGUF file through transformers' own dequantizing path
(``GgufConfig(dequantize=True)``: dense weights, no compiled kernel asked of the model hub) and
``save_pretrained`` writes the model it loaded: ``model.safetensors`` (fp32: a dequantized GGUF's
values are not all bf16 values), ``tokenizer.json`` with the file's chat template,
``config.json`` and ``generation_config.json``. The folder loads with ``from_pretrained`` and
without ``gguf``.

A GGUF file is untrusted input. The conversion reads nothing but the file: it is copied alone
into an empty staging folder (``.NAME.src-*``) and hashed as it is copied, so a ``tokenizer.json``
or ``config.json`` lying beside the file is never read and the cache is keyed on the bytes
converted (a file that changes while it is read is refused). The copy's structure is checked
before transformers reads it (:func:`~llm_gym.policies.gguf_check.check_gguf`), and what
transformers cannot read is one :class:`~llm_gym.errors.InvalidArgumentError`.

The cache's folders, its lock and the completeness of a folder are
:mod:`llm_gym.policies.model_cache`'s. A conversion is written into a temporary folder
(``build_info.json`` last) that is renamed into place, so a folder is complete the moment it
appears; a folder without a ``build_info.json`` of ours is never replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, open_input
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies.model_cache import (
    BUILD_INFO,
    CONVERSION_VERSION,
    cache_lock,
    cache_root,
    is_complete,
    log,
    move_into_place,
    read_build_info,
    replaceable,
    temp_folder,
)

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

_CHUNK = 1 << 20

MAX_MODEL_FILE_BYTES = 1 << 40
"""The largest model file (``.gguf``, wheel) read: a terabyte, past the largest published."""

_MODEL_FILE = InputLimit(
    "model file", MAX_MODEL_FILE_BYTES, "llm_gym.policies.gguf.MAX_MODEL_FILE_BYTES"
)


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The SHA-256 of the regular file at ``path`` (at most :data:`MAX_MODEL_FILE_BYTES`; a
    FIFO or a device is refused, :func:`~llm_gym.core.input_files.open_input`), read in 1 MiB
    chunks."""
    digest = hashlib.sha256()
    with open_input(path, _MODEL_FILE) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def stage_file(path: Path, into: Path) -> tuple[Path, str]:
    """Copy the regular file at ``path`` alone into the empty folder ``into`` (under its own
    name); the copy and the SHA-256 of the bytes copied, read once."""
    digest = hashlib.sha256()
    copy = into / path.name
    with open_input(path, _MODEL_FILE) as source, open(copy, "xb") as sink:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    return copy, digest.hexdigest()


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


@contextlib.contextmanager
def no_hub_kernels() -> Iterator[None]:
    """transformers' GGUF loader answers "no compiled kernel" while this holds.

    Where the ``kernels`` package is installed, transformers asks the model hub for GGUF
    kernels (``integrations/gguf/kernels.py``: ``get_gguf_kernel`` when it unpacks blocks, also
    on the dequantizing path; ``kernelize_ggml_layers`` after loading). A conversion needs none
    (it writes dense weights on the CPU), and it reaches no network. The contract test is
    ``tests/test_gguf.py::test_transformers_gguf_kernel_hooks_exist``.
    """
    try:
        from transformers.integrations.gguf import kernels
    except ImportError:  # a release without them asks the hub for none
        yield
        return
    saved = kernels._gguf_kernel, kernels.kernelize_ggml_layers
    kernels._gguf_kernel, kernels.kernelize_ggml_layers = False, lambda model: None
    try:
        yield
    finally:
        kernels._gguf_kernel, kernels.kernelize_ggml_layers = saved


READ_ERRORS = (ValueError, KeyError, IndexError, OSError, struct.error, NotImplementedError)
"""What transformers raises on a GGUF file it cannot read: refused as one line naming it."""


def _convert_into(gguf_file: Path, out_dir: Path) -> None:
    """Write the HF folder of ``gguf_file`` (alone in its folder) into ``out_dir``: its header
    checked, the model loaded dense and saved, and the file's tokenizer with its chat
    template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from llm_gym.policies.gguf_check import check_gguf

    check_gguf(gguf_file)
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        with no_hub_kernels():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                dtype=torch.float32,
                quantization_config=GgufConfig(dequantize=True),
            )
    except READ_ERRORS as exc:
        said = (str(exc).strip().splitlines() or [""])[0][:300]
        raise InvalidArgumentError(
            f"{name}: transformers could not read the GGUF file ({type(exc).__name__}: {said}); "
            "is it a model transformers reads from GGUF (see its GGUF docs)?"
        ) from exc
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise InvalidArgumentError(
            f"{name}: the GGUF file's tokenizer has {len(tokenizer):,} tokens and its model "
            f"{rows:,} embedding rows; its ids past {rows - 1} would fail the forward pass."
        )
    for key in ("_name_or_path", "_model_name_or_path"):  # the staging folder: meaningless later
        model.config.__dict__.pop(key, None)
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int) and context > 0:
        tokenizer.model_max_length = context
    if getattr(tokenizer, "pad_token_id", None) is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        log(f"warning: {name} carries no chat template; chats need one")


def _convert_locked(
    gguf_file: Path, target: Path, source: dict[str, Any], sha256: str | None
) -> None:
    """Convert into a temporary folder renamed over ``target`` (under :func:`cache_lock`)."""
    if not replaceable(target):
        raise InvalidArgumentError(
            f"{target} exists and is not a converted model (no build_info.json of ours); "
            "move it away or set LLM_GYM_CACHE to another folder."
        )
    require_gguf()
    staging = temp_folder(target, "src")
    tmp_dir = temp_folder(target, "tmp")
    start = time.perf_counter()
    try:
        staged, digest = stage_file(gguf_file, staging)
        if sha256 is not None and digest != sha256:
            raise LlmGymError(
                f"{gguf_file} has SHA-256 {digest} as copied, expected {sha256}: it changed "
                "while it was read; convert again."
            )
        log(f"converting {gguf_file.name} into {target}")
        _convert_into(staged, tmp_dir)
        shutil.rmtree(staging, ignore_errors=True)  # the disk's peak: one copy of the file
        umask = os.umask(0o022)
        os.umask(umask)
        tmp_dir.chmod(0o777 & ~umask)
        files = {}
        for file in sorted(tmp_dir.iterdir()):
            file.chmod(0o666 & ~umask)
            files[file.name] = file.stat().st_size
        info = {
            "source": source,
            "gguf_sha256": digest,
            "conversion_version": CONVERSION_VERSION,
            "files": files,
            "convert_seconds": round(time.perf_counter() - start, 2),
        }
        record = tmp_dir / BUILD_INFO
        record.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        record.chmod(0o666 & ~umask)
        move_into_place(tmp_dir, target)  # complete the moment it appears
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"converted in {info['convert_seconds']:.1f}s: {target}")


def ensure_converted(
    gguf_file: Path,
    target: Path,
    source: dict[str, Any],
    *,
    force: bool = False,
    lock: bool = True,
    sha256: str | None = None,
) -> Path:
    """``target`` holding the conversion of ``gguf_file`` (recorded as ``source``): as it is when
    complete (unless ``force``), else converted anew. Both the check and the conversion run
    under :func:`cache_lock` (``lock=False``: the caller holds it). ``sha256``: the digest the
    file must have as it is read (refused otherwise)."""
    with cache_lock(target) if lock else contextlib.nullcontext():
        if not force and is_complete(target, source):
            return target
        _convert_locked(gguf_file, target, source, sha256)
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
    target = target.expanduser().absolute()
    return ensure_converted(path.absolute(), target, source, force=force, sha256=digest)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    """:func:`sha256_file`, remembered per file and its size and modification time: a loader
    that resolves the same file again does not read it again."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]
