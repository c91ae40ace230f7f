"""The seeded task generator and the train / val / test splits of Code-v0.

``generate_tasks(seed, n)`` draws problems from the template bank
(:data:`TEMPLATES`: 41 templates with parameters), runs each reference solution here, in the
parent process, to compute the expected outputs, and builds one :class:`~llm_gym.core.Task` per
problem:

- ``prompt``: the signature, the statement and the visible examples (with their outputs);
- ``target``: ``{"entry": name, "tests": [{"args": [...], "expected": ...}, ...]}``, the hidden
  tests (never shown to the model, never sent to the sandbox);
- ``metadata``: template, entry, signature, the visible ``examples`` (same shape as the tests),
  the ``reference`` solution (used by the oracle) and the drawn ``params``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from llm_gym.core.task import Task, cut_splits, distinct_tasks, pick_split
from llm_gym.envs.code import problems_lists, problems_numbers, problems_text
from llm_gym.envs.code.problem import Problem

__all__ = [
    "SPLIT_SIZES",
    "TASK_SEED",
    "TEMPLATES",
    "call_text",
    "canonical",
    "generate_tasks",
    "get_tasks",
]

TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    *problems_numbers.TEMPLATES,
    *problems_text.TEMPLATES,
    *problems_lists.TEMPLATES,
)
"""Every problem template, in a fixed order."""
SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; the splits are disjoint (no prompt appears in two)."""
TASK_SEED = 20261205
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""
MAX_SHOWN_CHARS = 200
"""Arguments and values longer than this are cut in prompts and feedback."""


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data (tuples become lists), the form outputs are compared in."""
    if isinstance(value, tuple | list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    return value


def _short(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def call_text(entry: str, args: list[Any]) -> str:
    """``"f(1, 'a')"``: how a call is shown (long arguments are cut)."""
    return _short(f"{entry}({', '.join(repr(a) for a in args)})")


@functools.lru_cache(maxsize=4096)
def _reference_function(source: str, entry: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "<reference>", "exec"), namespace)  # our own template code
    return namespace[entry]


def _solve(problem: Problem, inputs: tuple[tuple[Any, ...], ...]) -> list[dict[str, Any]]:
    function = _reference_function(problem.reference, problem.entry)
    return [
        {"args": canonical(args), "expected": canonical(function(*canonical(args)))}
        for args in inputs
    ]


def _prompt(problem: Problem, examples: list[dict[str, Any]]) -> str:
    lines = [
        f"Write a Python function `{problem.signature}` that {problem.description}.",
        "",
        "Examples:",
    ]
    for example in examples:
        lines.append(
            f"    {call_text(problem.entry, example['args'])} == "
            f"{_short(repr(example['expected']))}"
        )
    lines += ["", f"Your `{problem.entry}` is graded on hidden tests with other inputs."]
    return "\n".join(lines)


def _task(problem: Problem) -> Task:
    examples = _solve(problem, problem.visible)
    tests = _solve(problem, problem.hidden)
    metadata = {
        "template": problem.template,
        "entry": problem.entry,
        "signature": problem.signature,
        "examples": examples,
        "reference": problem.reference,
        "params": problem.params,
    }
    return Task(
        prompt=_prompt(problem, examples),
        target={"entry": problem.entry, "tests": tests},
        metadata=metadata,
    )


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` distinct tasks (no two share a prompt) drawn from a ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list. Each task picks
    a template uniformly, then the template draws its parameters and inputs from the same rng.
    """
    rng = random.Random(seed)
    return distinct_tasks(lambda: _task(rng.choice(TEMPLATES)(rng)), n)


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    return cut_splits(universe, SPLIT_SIZES, "code")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)
