"""The public API: every exported name exists; importing llm_gym pulls in no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MODULES = [
    "llm_gym",
    "llm_gym.core",
    "llm_gym.envs",
    "llm_gym.types",
    "llm_gym.actions",
    "llm_gym.gym",
    "llm_gym.tools",
    "llm_gym.rollout",
    "llm_gym.policies",
    "llm_gym.serving",
    "llm_gym.models",
    "llm_gym.errors",
    "llm_gym.envs.tool_use_game",
    "llm_gym.environments",
    "llm_gym.datasets",
    "llm_gym.eval",
    "llm_gym.eval.leaderboard",
    "llm_gym.eval.leaderboard_render",
    "llm_gym.eval.leaderboard_run",
    "llm_gym.eval.leaderboard_cli",
]


@pytest.mark.parametrize("module_name", MODULES)
def test_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_import_pulls_no_heavy_dependency() -> None:
    code = (
        "import sys, llm_gym, llm_gym.rollout, llm_gym.policies, llm_gym.serving, llm_gym.eval\n"
        "import llm_gym.envs.tool_use_game, llm_gym.environments, llm_gym.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'accelerate') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_errors_inherit_builtins() -> None:
    from llm_gym import errors

    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.CalculatorError, ValueError)
    assert issubclass(errors.UnknownNameError, KeyError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.LlmGymError)
