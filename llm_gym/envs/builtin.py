"""The built-in environments: one row each, registered by :func:`register_builtin_envs`.

Every row points at a package ``llm_gym.envs.<package>`` that exposes its env class,
``get_tasks(split)`` and ``oracle_action(task, messages)``. Registration stores ``"module:attr"``
strings only, so it imports no environment code. A new built-in environment is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_gym.gym.registration import register_env

__all__ = ["BUILTIN_ENVS", "BuiltinEnv", "register_builtin_envs"]


@dataclass(frozen=True)
class BuiltinEnv:
    """One built-in environment."""

    id: str
    """The gymnasium id."""
    package: str
    """Its package under ``llm_gym.envs``."""
    env_class: str
    """The env class's name in that package."""
    max_turns: int
    """The loop's turn limit (an env that caps its own episodes may end them sooner)."""
    description: str
    """One line for ``llm-gym list``."""
    version: str = "0"
    """The environment's version."""


BUILTIN_ENVS: tuple[BuiltinEnv, ...] = (
    BuiltinEnv("ToolUseGame-v0", "tool_use_game", "ToolUseGameEnv", 8,
               "Answer questions about fictional towns with list_fact_keys, lookup and a "
               "calculator."),
    BuiltinEnv("GuessNumber-v0", "guess_number", "GuessNumberEnv", 12,
               "Find a secret integer in a range from higher/lower feedback (per-turn rewards)."),
    BuiltinEnv("Math-v0", "math", "MathEnv", 6,
               "Solve arithmetic word problems with a calculator tool; exact answers."),
    BuiltinEnv("Wordle-v0", "wordle", "WordleEnv", 10,
               "Guess a five-letter word in six tries from per-letter feedback (invalid words "
               "cost no try)."),
    BuiltinEnv("Refund-v0", "refund", "RefundEnv", 12,
               "Customer service on a stateful store API: authenticate, inspect orders, refund "
               "within policy."),
    BuiltinEnv("SQL-v0", "sql", "SQLEnv", 8,
               "Answer questions about a per-task SQLite database through a read-only query "
               "tool."),
    BuiltinEnv("Code-v0", "code", "CodeEnv", 6,
               "Write a Python function that passes hidden tests; code runs in a sandboxed "
               "process."),
    BuiltinEnv("Maze-v0", "maze", "MazeEnv", 40,
               "Reach the goal of a text grid under partial observation with look and move "
               "tools."),
)  # fmt: skip


def register_builtin_envs() -> None:
    """Register every row of :data:`BUILTIN_ENVS` (idempotent; ``import llm_gym`` calls it)."""
    for row in BUILTIN_ENVS:
        package = f"llm_gym.envs.{row.package}"
        register_env(
            row.id,
            env=f"{package}:{row.env_class}",
            tasks=f"{package}:get_tasks",
            oracle=f"{package}:oracle_action",
            description=row.description,
            max_turns=row.max_turns,
            version=row.version,
        )
