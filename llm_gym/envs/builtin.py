"""The built-in environments: one row each, registered by :func:`register_builtin_envs`.

Every row points at a package ``llm_gym.envs.<package>`` that exposes its env class,
``get_tasks(split)`` and ``oracle_action(task, messages)``. Registration stores ``"module:attr"``
strings only, so it imports no environment code. A new built-in environment is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium

from llm_gym.gym.registration import TEXT_ENV_ENTRY_POINT, register_env

__all__ = ["BUILTIN_ENVS", "OPENENV_ID", "BuiltinEnv", "register_builtin_envs"]

OPENENV_ID = "OpenEnv-v0"
"""``gym.make(OPENENV_ID, base_url=...)`` plays an OpenEnv server (the interop extra)."""


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
    tasks: str = "get_tasks"
    """The task source's name in that package (``split -> tasks``)."""
    entry_point: str = TEXT_ENV_ENTRY_POINT
    """What ``gym.make`` builds, as ``"module:Class"``: TextEnv, or a subclass that takes more
    keywords."""


_RG_TEXT_ENV = "llm_gym.envs.reasoning_gym.text_env:ReasoningGymTextEnv"

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
    # reasoning-gym (the interop extra, imported on first use): 37 datasets by name, then one
    # id per family; the turn limit is the most attempts a task may allow (1 by default).
    BuiltinEnv("ReasoningGym-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "Any reasoning-gym dataset (dataset=..., default basic_arithmetic), scored by "
               "its own scorer; retry with feedback via max_attempts.",
               entry_point=_RG_TEXT_ENV),
    BuiltinEnv("RG-BasicArithmetic-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "reasoning-gym basic_arithmetic: evaluate an integer expression with + - * / "
               "and brackets.",
               tasks="basic_arithmetic_tasks", entry_point=_RG_TEXT_ENV),
    BuiltinEnv("RG-ChainSum-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "reasoning-gym chain_sum: add and subtract a chain of integers.",
               tasks="chain_sum_tasks", entry_point=_RG_TEXT_ENV),
    BuiltinEnv("RG-SpellBackward-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "reasoning-gym spell_backward: spell a word backward.",
               tasks="spell_backward_tasks", entry_point=_RG_TEXT_ENV),
    BuiltinEnv("RG-WordSorting-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "reasoning-gym word_sorting: sort words by ASCII/Unicode order (partial credit "
               "per word in place).",
               tasks="word_sorting_tasks", entry_point=_RG_TEXT_ENV),
    BuiltinEnv("RG-FamilyRelationships-v0", "reasoning_gym", "ReasoningGymEnv", 10,
               "reasoning-gym family_relationships: name how two people of a family tree are "
               "related.",
               tasks="family_relationships_tasks", entry_point=_RG_TEXT_ENV),
)  # fmt: skip


def register_builtin_envs() -> None:
    """Register every row of :data:`BUILTIN_ENVS` (idempotent; ``import llm_gym`` calls it)."""
    for row in BUILTIN_ENVS:
        package = f"llm_gym.envs.{row.package}"
        register_env(
            row.id,
            env=f"{package}:{row.env_class}",
            tasks=f"{package}:{row.tasks}",
            oracle=f"{package}:oracle_action",
            description=row.description,
            max_turns=row.max_turns,
            version=row.version,
            entry_point=row.entry_point,
        )
    if OPENENV_ID not in gymnasium.registry:
        # Any OpenEnv server as a TextEnv: gym.make("OpenEnv-v0", base_url=...). Only
        # gymnasium knows it (no catalogue row: its tasks are the server's).
        gymnasium.register(
            OPENENV_ID,
            entry_point="llm_gym.integrations.openenv.registration:make_text_env",
            disable_env_checker=True,
        )
