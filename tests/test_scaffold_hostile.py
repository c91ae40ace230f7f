"""Hostile inputs to ``llm-gym new-env`` (:mod:`llm_gym.scaffold`): a NAME that would shadow a
module Python imports, and a target path that is a symbolic link (to a folder, dangling) or races
one in. The scaffold writes only into a real folder it created, and says so in one line.

==============================  =======================================  ======================
case                            without a fix                            what holds
==============================  =======================================  ======================
a NAME whose env id is taken    written; the package's ``register()``    refused, naming the id
(``guess_number``,              raised "already registered" (llm_gym's   and a free NAME
``math_env``, ``cart_pole``)    ids) or replaced gymnasium's CartPole
a --dir where no folder can be  a raw ``FileNotFoundError`` /            one line naming the
made (``/proc``, ``/sys``,      ``PermissionError`` with a traceback     folder and the reason
read-only)                      log
a NAME with a Unicode           (contained, now tested) refused by the   the same
lookalike or a trailing line    ASCII pattern
break
==============================  =======================================  ======================
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import llm_gym.scaffold
from llm_gym.cli import main
from llm_gym.errors import InvalidArgumentError
from llm_gym.scaffold import new_env, scaffold_names


@pytest.mark.parametrize("name", ["numpy", "yaml", "torch", "transformers"])
def test_a_name_python_can_import_is_refused(name: str, tmp_path: Path) -> None:
    pytest.importorskip(name)
    assert name not in sys.stdlib_module_names  # installed packages, not the standard library
    with pytest.raises(InvalidArgumentError, match=f"{name!r} would shadow a module"):
        scaffold_names(name)
    with pytest.raises(InvalidArgumentError, match=f"e.g. '{name}_env'"):
        new_env(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_module_on_the_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_helpers.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="'my_helpers' would shadow a module"):
        new_env("my_helpers", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_shadowing_name_in_one_line(tmp_path: Path, capsys) -> None:
    assert main(["new-env", "numpy", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym new-env: error: NAME 'numpy' would shadow a module")
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_a_link_to_a_folder_is_not_written_through(tmp_path: Path, capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "guess_game").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InvalidArgumentError, match="already exists.*nothing was written"):
        new_env("guess_game", tmp_path / "out")
    assert main(["new-env", "guess_game", "--dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert list(elsewhere.iterdir()) == []


def test_a_dangling_link_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "guess_game").symlink_to(tmp_path / "missing")
    assert main(["new-env", "guess_game", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym new-env: error: ") and "already exists" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "missing").exists()  # nothing created through the link


def test_a_link_raced_in_after_the_folder_is_made_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is swapped for a link between its creation and the writes: nothing is written
    through the link (the writes go through the folder's descriptor, or refuse the link)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real_mkdir = os.mkdir

    def mkdir_then_swap(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if Path(path).name == "guess_game" and not kwargs.get("dir_fd"):
            os.rename(path, tmp_path / "moved")
            os.symlink(elsewhere, path)

    monkeypatch.setattr(llm_gym.scaffold.os, "mkdir", mkdir_then_swap)
    with pytest.raises(InvalidArgumentError, match="Could not write the scaffold"):
        new_env("guess_game", tmp_path)
    assert list(elsewhere.iterdir()) == []


def test_a_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "a_file").write_text("keep me")
    assert main(["new-env", "guess_game", "--dir", str(tmp_path / "a_file")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym new-env: error: Could not create the folder")
    assert err.count("\n") == 1 and (tmp_path / "a_file").read_text() == "keep me"


@pytest.mark.parametrize(
    ("name", "env_id"),
    [("guess_number", "GuessNumber-v0"), ("math_env", "Math-v0"), ("cart_pole", "CartPole-v0")],
)
def test_a_name_whose_env_id_is_registered_is_refused(
    name: str, env_id: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidArgumentError, match=f"env id '{env_id}', which is already") as e:
        new_env(name, tmp_path)
    suggestion = str(e.value).rsplit("e.g. ", 1)[1].strip("'.")
    assert scaffold_names(suggestion).env_id != env_id  # the suggestion is free
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_a_folder_where_nothing_can_be_made_is_one_line(folder: str, capsys) -> None:
    if not os.path.isdir(folder):
        pytest.skip(f"no {folder} here")
    assert main(["new-env", "my_scaffold_probe", "--dir", folder]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("llm-gym new-env: error: Could not create the folder ")
        and err.count("\n") == 1
    )
    assert "traceback" not in err and "--dir" in err


def test_a_read_only_folder_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    def refuse(path, mode=0o777, *, dir_fd=None):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(llm_gym.scaffold.os, "mkdir", refuse)  # root ignores a chmod
    assert main(["new-env", "my_scaffold_probe", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Could not create the folder" in err and "Permission denied" in err


@pytest.mark.parametrize("name", ["\uff47uess", "guess\u0131", "guess\n", "gue\u200bss"])
def test_lookalike_and_invisible_characters_are_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="lowercase Python package name"):
        new_env(name, tmp_path)
    assert list(tmp_path.iterdir()) == []
