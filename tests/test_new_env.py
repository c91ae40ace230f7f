"""``llm-gym new-env NAME``: the scaffold writes a runnable package whose own tests pass untouched
(run here in a subprocess), validates NAME, and never overwrites. Both styles: the native
``ToolEnv`` starter (the default) and document 002's ``--multi-turn`` starter."""

from __future__ import annotations

import doctest
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import llm_gym.scaffold
from llm_gym.cli import main
from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.scaffold import SCAFFOLD_STYLES, new_env, scaffold_names

NATIVE_FILES = {
    "README.md",
    "__init__.py",
    "__main__.py",
    "env.py",
    "tests/__init__.py",
    "tests/test_convert_units.py",
}

EXPECTED_FILES = {
    "README.md",
    "__init__.py",
    "environment.py",
    "data/train.jsonl",
    "data/val.jsonl",
    "data/test.jsonl",
    "tests/__init__.py",
    "tests/test_guess_game.py",
}


def files_under(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}


def run_python(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the folder's parent, as a user would run it, with this checkout's
    llm_gym first on the path."""
    checkout = str(Path(llm_gym.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args],
        cwd=folder.parent,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest FOLDER`` from the folder's parent, as a user would run it."""
    return run_python(folder, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, folder.name)


def break_code(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must be there) by ``new`` in the file at ``path``."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def test_native_tests_pass_untouched_and_can_fail(tmp_path: Path) -> None:
    package = new_env("convert_units", tmp_path)
    assert package == tmp_path / "convert_units"
    assert files_under(package) == NATIVE_FILES
    for path in package.rglob("*"):
        assert path.is_dir() or "{{" not in path.read_text(), path  # every placeholder filled
    text = (package / "env.py").read_text()
    assert "class ConvertUnitsEnv(ToolEnv):" in text and "@tool\ndef convert(" in text
    for name in ("generate_tasks", "get_tasks", "oracle_action", "register"):
        assert f"def {name}(" in text
    assert 'ENV_ID = "ConvertUnits-v0"' in text and 'env=f"{__name__}:ConvertUnitsEnv"' in text
    readme = (package / "README.md").read_text()
    assert "## Make it your own task" in readme and "convert_units.register()" in readme

    result = run_pytest(package)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "13 passed" in result.stdout

    # the entry point registers the env and runs llm-gym's commands on it
    result = run_python(package, "-m", "convert_units", "show-task", "--index", "0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["id"] == "convert_units/val/0000"

    # the generated tests are not vacuous: a reward that pays everything fails them ...
    env_py = package / "env.py"
    break_code(env_py, "abs_tol=0.0) else 0.0", "abs_tol=0.0) else 1.0")
    result = run_pytest(package, "-k", "reward_on_hand_made or random_policy")
    assert result.returncode == 1 and "2 failed" in result.stdout, result.stdout
    # ... and so does an oracle that reads the target it is scored against
    env_py.write_text(text)
    break_code(env_py, "content=results[-1]", "content=str(task.target)")
    result = run_pytest(package, "-k", "oracle_solves")
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout


def test_generated_tests_pass_untouched_and_can_fail(tmp_path: Path) -> None:
    package = new_env("guess_game", tmp_path, style="multi-turn")
    assert package == tmp_path / "guess_game"
    assert files_under(package) == EXPECTED_FILES
    for path in package.rglob("*"):
        assert path.is_dir() or "{{" not in path.read_text(), path  # every placeholder filled
    text = (package / "environment.py").read_text()
    assert "class GuessGameEnv(EnvironmentMultiTurn):" in text
    for hook in ("start_episode", "max_episode_turns", "step_episode", "score_episode"):
        assert f"def {hook}(" in text
    assert 'ENV_ID = "GuessGame-v0"' in text and "def load_environment(split" in text
    readme = (package / "README.md").read_text()
    assert "## Make it your own task" in readme and "guess_game.register()" in readme

    result = run_pytest(package)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout

    # the generated tests are not vacuous: a broken reward fails them
    broken = text.replace("score=1.0 if state.solved else 0.0", "score=0.0")
    assert broken != text
    (package / "environment.py").write_text(broken)
    result = run_pytest(package, "-k", "reward_on_hand_made")
    assert result.returncode == 1 and "1 failed" in result.stdout


def test_cli_new_env_native_by_default(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["new-env", "refund_desk", "--dir", str(tmp_path)], out=out) == 0
    package = tmp_path / "refund_desk"
    assert files_under(package) == {p.replace("convert_units", "refund_desk") for p in NATIVE_FILES}
    assert "class RefundDeskEnv(ToolEnv):" in (package / "env.py").read_text()
    assert out.getvalue().splitlines()[0] == (
        f"created {package} (RefundDeskEnv, registers as RefundDesk-v0)"
    )


def test_unknown_style_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert set(SCAFFOLD_STYLES) == {"tool", "multi-turn"}
    with pytest.raises(UnknownNameError, match="one of.*actual value: 'multiturn'.*'multi-turn'"):
        new_env("guess_game", tmp_path, style="multiturn")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        main(["new-env", "guess_game", "--style", "multi-turn", "--multi-turn"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_new_env(tmp_path: Path) -> None:
    out = io.StringIO()
    argv = ["new-env", "refund_desk", "--dir", str(tmp_path / "envs"), "--multi-turn"]
    assert main(argv, out=out) == 0
    package = tmp_path / "envs" / "refund_desk"
    assert (package / "tests" / "test_refund_desk.py").is_file()
    assert "class RefundDeskEnv(" in (package / "environment.py").read_text()
    assert out.getvalue().splitlines() == [
        f"created {package} (RefundDeskEnv, registers as RefundDesk-v0)",
        f"next: python -m pytest {package}; then read {package / 'README.md'}",
    ]


def test_names() -> None:
    names = scaffold_names("guess_game")
    assert (names.package, names.class_name, names.env_id) == (
        "guess_game",
        "GuessGameEnv",
        "GuessGame-v0",
    )
    assert scaffold_names("support_env").class_name == "SupportEnv"
    assert scaffold_names("maze2").env_id == "Maze2-v0"
    assert names.render("{{package}}/{{class_name}}/{{env_id}}") == (
        "guess_game/GuessGameEnv/GuessGame-v0"
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("My-Task", "lowercase Python package name.*e.g. 'my_task'"),
        ("MyTask", "e.g. 'my_task'"),
        ("1st_env", "a letter, then letters, digits or underscores"),
        ("", "lowercase Python package name"),
        ("a" * 65, "64 characters at most"),
        ("guess game", "e.g. 'guess_game'"),
        ("class", "would shadow a Python keyword"),
        ("json", "would shadow"),
        ("llm_gym", "would shadow"),
        ("tests", "would shadow"),
    ],
)
def test_invalid_names_are_clear_errors(name: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        new_env(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_invalid_name_on_the_command_line(tmp_path: Path, capsys) -> None:
    assert main(["new-env", "My-Task", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym new-env: error: NAME must be a lowercase Python package name")


def test_never_overwrites(tmp_path: Path, capsys) -> None:
    existing = tmp_path / "guess_game"
    existing.mkdir()
    (existing / "mine.py").write_text("keep me")
    with pytest.raises(InvalidArgumentError, match="already exists.*nothing was written"):
        new_env("guess_game", tmp_path)
    assert main(["new-env", "guess_game", "--dir", str(tmp_path)]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert files_under(existing) == {"mine.py"}
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="already exists"):
        new_env("a_file", tmp_path)
    # an empty folder too: the scaffold writes only into a folder it creates
    (tmp_path / "empty_env").mkdir()
    with pytest.raises(InvalidArgumentError, match="already exists"):
        new_env("empty_env", tmp_path, style="multi-turn")
    assert list((tmp_path / "empty_env").iterdir()) == []


def test_docstring_examples() -> None:
    result = doctest.testmod(llm_gym.scaffold)
    assert result.failed == 0 and result.attempted > 0
