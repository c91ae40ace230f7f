"""The docstring examples of the pure modules run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["llm_gym.eval.metrics", "llm_gym.core.tool", "llm_gym.gym.spaces", "llm_gym.core.task"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0


def test_trainer_math_examples() -> None:
    pytest.importorskip("trl")
    result = doctest.testmod(importlib.import_module("trainers.advantages"))
    assert result.failed == 0 and result.attempted > 0
