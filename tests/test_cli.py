"""The llm-gym command line, run in-process and as a real subprocess."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from llm_gym.cli import _cmd_play, build_parser, main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_list_shows_ids_with_descriptions() -> None:
    code, text = run("list")
    assert code == 0
    line = next(line for line in text.splitlines() if line.startswith("ToolUseGame-v0"))
    assert "lookup" in line


def test_show_task_prints_json() -> None:
    code, text = run("show-task", "ToolUseGame-v0", "--split", "val", "--index", "3")
    assert code == 0
    assert json.loads(text)["id"] == "tool_use_game/val/0003"


def test_unknown_env_is_a_clear_error(capsys) -> None:
    code, _ = run("show-task", "ToolUseGam-v0")
    assert code == 2
    assert "Did you mean 'ToolUseGame-v0'" in capsys.readouterr().err


def test_play_an_episode_by_typing() -> None:
    from llm_gym.envs.tool_use_game import get_tasks

    task = get_tasks("val")[0]
    keys = task.metadata["keys"]
    typed = iter(
        [
            ":oracle",
            '<tool_call>{"name": "lookup", \\',
            f'"arguments": {{"key": "{keys[0]}"}}}}</tool_call>',
            "12",
        ]
    )
    out = io.StringIO()
    args = build_parser().parse_args(["play", "ToolUseGame-v0", "--index", "0"])
    assert _cmd_play(args, out, read_line=lambda prompt: next(typed)) == 0
    text = out.getvalue()
    assert task.prompt in text and "<tool_response>" in text and "Reward:" in text


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llm_gym.cli", "list"], capture_output=True, text=True, check=True
    )
    assert "ToolUseGame-v0" in out.stdout


def test_show_task_index_range_names_negative_indexes(capsys) -> None:
    code, text = run("show-task", "ToolUseGame-v0", "--split", "val", "--index", "-1")
    assert code == 0 and json.loads(text)["id"]  # the last task, as Python indexes
    code, _ = run("show-task", "ToolUseGame-v0", "--split", "val", "--index", "100000")
    assert code == 2 and "must be in [-" in capsys.readouterr().err  # said [0, n) before
