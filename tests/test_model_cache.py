"""The model cache's folders under attack (llm_gym.policies.model_cache, through
``convert_gguf`` and ``fetch_model`` with the conversion stubbed): whom a folder belongs to,
links, the lock, paths the system refuses, and what a killed conversion leaves.

================================  =====================================  ======================
case                              without a fix                          what holds
================================  =====================================  ======================
a complete-looking conversion     loaded as the model: another user      refused, one line
planted in a folder another user  chose its weights                      naming the owner
owns (or in a cache folder
another user owns)
the model folder a symbolic link  followed to wherever it points         refused
the lock file a symbolic link     followed (and opened for writing)      refused; the file it
                                                                         names left untouched
LLM_GYM_CACHE with a NUL byte, a  ``ValueError`` or ``OSError``          one line naming the
name too long                     tracebacks                             path and the remedy
a conversion killed mid-way       a temporary folder (1 GB for a         removed by the next
                                  real model) that nothing removed       conversion of the model
the completeness check            read outside the lock, while another   read only under the
                                  process replaced the folder            lock
================================  =====================================  ======================
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import gguf, model_cache

OTHER_UID = 12345


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The conversion replaced by a stub that writes two files; the files it was given."""
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def convert(gguf_file: Path, out_dir: Path) -> None:
        calls.append(gguf_file)
        (out_dir / "model.safetensors").write_bytes(b"weights")
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert_into", convert)
    monkeypatch.setattr(gguf, "require_gguf", lambda: None)
    return calls


def _file(tmp_path: Path, content: bytes = b"GGUF-content") -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(content)
    return path


needs_uids = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another uid needs root"
)


@needs_uids
def test_a_conversion_in_another_users_folder_is_refused(tmp_path, stub) -> None:
    file = _file(tmp_path)
    folder = gguf.convert_gguf(file)  # a complete conversion, then handed to another user
    os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(InvalidArgumentError, match=f"belongs to another user \\(uid {OTHER_UID}"):
        gguf.convert_gguf(file)
    os.chown(folder, 0, 0)
    os.chown(folder.parent, OTHER_UID, OTHER_UID)  # the cache folder itself
    with pytest.raises(InvalidArgumentError, match="model cache folder .* another user"):
        gguf.convert_gguf(file)
    assert len(stub) == 1


@needs_uids
def test_another_users_lock_file_is_refused(tmp_path, stub) -> None:
    folder = gguf.convert_gguf(_file(tmp_path))
    os.chown(folder.parent / f".{folder.name}.lock", OTHER_UID, OTHER_UID)
    with pytest.raises(InvalidArgumentError, match="lock file .* another user"):
        gguf.convert_gguf(_file(tmp_path))


def test_links_are_never_followed(tmp_path, stub) -> None:
    file = _file(tmp_path)
    folder = gguf.convert_gguf(file)
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)  # the model folder: a link to a complete conversion
    with pytest.raises(InvalidArgumentError, match="is a symbolic link; the model cache follows"):
        gguf.convert_gguf(file)
    folder.unlink()
    lock = folder.parent / f".{folder.name}.lock"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(InvalidArgumentError, match="lock file .* is a symbolic link"):
        gguf.convert_gguf(file)
    assert victim.read_text() == "keep" and not folder.exists()
    lock.unlink()
    if hasattr(os, "mkfifo"):
        os.mkfifo(lock)
        with pytest.raises(InvalidArgumentError, match="lock file .* not a regular file"):
            gguf.convert_gguf(file)


def test_a_file_in_the_folder_that_is_a_link_makes_it_incomplete(tmp_path, stub) -> None:
    folder = gguf.convert_gguf(_file(tmp_path))
    weights = folder / "model.safetensors"
    (tmp_path / "w").write_bytes(weights.read_bytes())
    weights.unlink()
    weights.symlink_to(tmp_path / "w")  # same size, but a link
    source = json.loads((folder / "build_info.json").read_text())["source"]
    assert not model_cache.is_complete(folder, source)
    gguf.convert_gguf(_file(tmp_path))
    assert not weights.is_symlink() and len(stub) == 2


def test_paths_the_system_refuses_are_one_line(tmp_path, stub, monkeypatch) -> None:
    """A cache path with a name too long, an output folder with a NUL byte or a name too long:
    one line naming the path and the remedy, never an ``OSError`` or ``ValueError`` traceback."""
    monkeypatch.setenv("LLM_GYM_CACHE", f"/tmp/{'n' * 300}")
    with pytest.raises(InvalidArgumentError, match="not a path the system takes") as caught:
        gguf.convert_gguf(_file(tmp_path))
    assert "\n" not in str(caught.value) and "LLM_GYM_CACHE" in str(caught.value)
    for output in ("with\0nul", f"{'o' * 300}/x"):
        with pytest.raises(InvalidArgumentError, match="cannot .* LLM_GYM_CACHE") as caught:
            gguf.convert_gguf(_file(tmp_path), str(tmp_path / output))
        assert "\n" not in str(caught.value)


def test_a_killed_conversions_temporary_folders_are_swept(tmp_path, stub) -> None:
    """A conversion killed mid-way leaves ``.NAME.tmp-*`` (and a fetch ``.NAME.fetch-*``); the
    next conversion of the model removes them. Another model's, and links, are left alone."""
    file = _file(tmp_path)
    models = tmp_path / "cache" / "models"
    folder = gguf.convert_gguf(file)
    stale = [models / f".{folder.name}.{kind}-dead" for kind in model_cache.TEMP_KINDS]
    for path in stale:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x" * 1000)
    others = models / ".another-model.tmp-alive"
    others.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    (models / f".{folder.name}.tmp-link").symlink_to(kept)
    gguf.convert_gguf(file, force=True)
    assert not any(path.exists() for path in stale)
    assert others.is_dir() and kept.is_dir()
    assert (models / f".{folder.name}.tmp-link").is_symlink()


def test_the_completeness_check_runs_holding_the_lock(tmp_path, stub, monkeypatch) -> None:
    from llm_gym.policies import pretrained

    held: list[bool] = [False]
    real_lock, real_complete = model_cache.cache_lock, model_cache.is_complete

    @contextlib.contextmanager
    def lock(target):
        with real_lock(target):
            held[0] = True
            try:
                yield
            finally:
                held[0] = False

    def complete(folder, source):
        assert held[0], "is_complete read outside the lock"
        return real_complete(folder, source)

    for module in (gguf, pretrained):
        monkeypatch.setattr(module, "cache_lock", lock)
        monkeypatch.setattr(module, "is_complete", complete)
    file = _file(tmp_path)
    folder = gguf.convert_gguf(file)
    assert gguf.convert_gguf(file) == folder and len(stub) == 1
