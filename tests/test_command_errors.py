"""How ``llm-gym`` and ``train.py`` end on an error (llm_gym.command_errors): one line, exit code
2 for a mistake to fix, 1 plus a log file holding the traceback for anything else.

=============================  ==================================  ============================
input                          without the mechanism               with it
=============================  ==================================  ============================
``eval --policy hf:/no/such``  OSError traceback from transformers  "no such model folder", 2
``LLM_GYM_CACHE`` a file, or   NotADirectoryError traceback        names the file that is in
a path under a file                                                the way, 2
``--task-option`` JSON nested  RecursionError traceback            "nested more than 100
100,000 deep                                                       levels", 2
``train.py --set`` YAML nested RecursionError traceback            "nests more than 100
100,000 deep                                                       levels", 2
a bug (any other exception)    traceback on the terminal           one line naming a log file
                                                                   with the traceback, 1
=============================  ==================================  ============================
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from llm_gym.cli import main


@pytest.fixture(autouse=True)
def temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Error logs go under this test's folder."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _one_line(capsys: pytest.CaptureFixture[str], start: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1, err
    return err


def test_a_model_path_that_is_not_there_is_one_line(capsys) -> None:
    pytest.importorskip("transformers")
    for spec, what in [("hf:/no/such", "no such model folder"), ("hf:/dev/null", "not a model")]:
        code = main(["eval", "GuessNumber-v0", "--policy", spec, "--episodes", "1"])
        err = _one_line(capsys, f"llm-gym eval: error: {what}")
        assert code == 2 and "give a folder holding config.json" in err


@pytest.mark.parametrize("under", [False, True], ids=["a file", "a path under a file"])
def test_a_cache_variable_naming_a_file_is_one_line(
    under: bool, tmp_path: Path, monkeypatch, capsys
) -> None:
    file = tmp_path / "cache"
    file.write_text("not a folder")
    monkeypatch.setenv("LLM_GYM_CACHE", str(file / "sub" if under else file))
    for argv in (["build-tiny-model"], ["fetch-model", "smollm2-135m-instruct"]):
        assert main(argv) == 2  # NotADirectoryError from mkdir without the check
        err = _one_line(capsys, f"llm-gym {argv[0]}: error: the model cache ")
        assert f"{str(file)!r}, which is not a folder" in err and "set LLM_GYM_CACHE" in err


def test_a_task_option_nested_100000_deep_is_one_line(capsys) -> None:
    option = "world_seed=" + "[" * 100_000
    assert main(["eval", "ToolUseGame-v0", "--task-option", option, "--episodes", "1"]) == 2
    err = _one_line(capsys, "llm-gym eval: error: world_seed: the JSON is nested more than 100")
    assert len(err) < 300


def test_an_unexpected_error_is_one_line_naming_its_log(temp_folder, monkeypatch, capsys) -> None:
    import llm_gym.cli

    def broken(args, out) -> int:
        return {}["no such key"]  # a bug: a plain KeyError is not a user's mistake

    monkeypatch.setattr(llm_gym.cli, "_cmd_list", broken)
    assert main(["list"]) == 1
    err = _one_line(capsys, "llm-gym list: unexpected error: KeyError: 'no such key' (the ")
    (log,) = temp_folder.glob("llm-gym-list-error-*.log")
    assert f"the traceback is in {log}; please report it)" in err
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in broken" in text


def test_a_librarys_error_is_one_line_with_its_log(temp_folder, monkeypatch, capsys) -> None:
    import llm_gym.cli

    def full(args, out) -> int:
        raise OSError(28, "No space left on device\nwhile writing")

    monkeypatch.setattr(llm_gym.cli, "_cmd_list", full)
    assert main(["list"]) == 2
    err = _one_line(capsys, "llm-gym list: error: [Errno 28] No space left on device while")
    (log,) = temp_folder.glob("llm-gym-list-error-*.log")
    assert f"(the traceback is in {log})" in err and "in full" in log.read_text()


def _train_script():
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(*sets: str) -> int:
    from tests.conftest import ROOT

    config = ROOT / "configs" / "tool_use_game_tiny.yaml"
    with pytest.raises(SystemExit) as info:
        _train_script().main(["--config", str(config), *[f"--set={s}" for s in sets]])
    return info.value.code


def test_train_py_deep_set_values_are_one_line(capsys) -> None:
    for value in ("[" * 100_000, "{a: " * 100_000):
        assert _train(f"seed={value}") == 2  # RecursionError without the depth limit
        err = _one_line(capsys, "train.py: error: --set seed: the YAML document nests more")
        assert "MAX_YAML_DEPTH" in err and len(err) < 300


def test_train_py_unexpected_errors_name_a_log_in_the_output_dir(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import trainers.pipeline.run

    def broken(config):
        raise ZeroDivisionError("a bug in the run")

    monkeypatch.setattr(trainers.pipeline.run, "run_pipeline", broken)
    assert _train(f"output_dir={tmp_path / 'run'}") == 1
    err = _one_line(capsys, "train.py: unexpected error: ZeroDivisionError: a bug in the run")
    (log,) = (tmp_path / "run").glob("train-py-error-*.log")
    assert str(log) in err and "ZeroDivisionError" in log.read_text()


# --- train.py: config files and --set values ------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "sets", "message"),
    [
        # IsADirectoryError
        ("<dir>", [], "is a directory, not a regular file; give a YAML or TOML file"),
        ("/dev/zero", [], "is a device, not a regular file"),  # read until MemoryError
        ("<latin1>", [], "not UTF-8 text (byte 10: b'\\xe9')"),  # UnicodeDecodeError traceback
        ("<big>", [], "larger than 1,048,576 bytes"),
        ("<ok>", ["seed=["], "--set seed: not valid YAML"),  # a YAML traceback
        ("<ok>", ["grpo..num_steps=2"], "--set expects KEY=VALUE with KEY a dotted name"),
        ("<ok>", ["env=Nope-v0"], "No llm_gym environment 'Nope-v0'"),  # traceback from the run
        # the message named the accepted option among the refused ones
        ("<ok>", ["task_options.foo=1"], "takes no option(s) ['foo']; it accepts: ['world_seed']"),
    ],
)
def test_train_py_config_mistakes_are_one_line(tmp_path, capsys, config, sets, message) -> None:
    from tests.conftest import ROOT

    files = {
        "<dir>": tmp_path,
        "<latin1>": tmp_path / "latin1.yaml",
        "<big>": tmp_path / "big.yaml",
        "<ok>": ROOT / "configs" / "tool_use_game_tiny.yaml",
    }
    (tmp_path / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))
    (tmp_path / "big.yaml").write_text("# padding\n" * 110_000)
    path = files.get(config, config)
    with pytest.raises(SystemExit) as info:
        _train_script().main(["--config", str(path), *[f"--set={s}" for s in sets]])
    text = capsys.readouterr().err
    assert info.value.code == 2
    assert text.startswith("train.py: error: ") and message in text, text
    assert len(text) < 1000 and text.count("\n") == 1
