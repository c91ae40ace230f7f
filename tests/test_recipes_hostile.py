"""Hostile counts on the recipes' command lines (``recipes/``), refused by argparse before any
model is built (:func:`llm_gym.command_errors.positive_int`).

==============================  =======================================  =====================
case                            without a fix                            what holds
==============================  =======================================  =====================
``grpo/tool_use_game.py         the tiny model was built, then the       a usage error (exit
--tasks -3``                    last three tasks were sliced away:       code 2) before any
                                training ran on a set nobody asked for   work
``--tasks 0``                   an empty task list, after the model      the same
``--num-steps 0``               GRPOConfig refused it after the model    the same
``serverless_eval/... --        refused by run_and_report after the      the same
episodes 0``                    model was built
==============================  =======================================  =====================
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import llm_gym.models

ROOT = Path(__file__).resolve().parent.parent


def _recipe(relative: str):
    spec = importlib.util.spec_from_file_location("recipe_under_test", ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("recipe", "argv"),
    [
        ("recipes/grpo/tool_use_game.py", ["--tasks", "-3"]),
        ("recipes/grpo/tool_use_game.py", ["--tasks", "0"]),
        ("recipes/grpo/tool_use_game_async.py", ["--num-steps", "0"]),
        ("recipes/serverless_eval/tool_use_game.py", ["--episodes", "0"]),
    ],
)
def test_counts_below_one_are_usage_errors_before_any_work(
    recipe: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    pytest.importorskip("trl")

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(llm_gym.models, "build_tiny_model", refuse)
    module = _recipe(recipe)
    monkeypatch.setattr(module, "build_tiny_model", refuse)
    with pytest.raises(SystemExit) as caught:
        module.main(argv)
    assert caught.value.code == 2
    assert "expected an integer >= 1" in capsys.readouterr().err
