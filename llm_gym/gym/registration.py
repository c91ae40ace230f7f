"""Registering environments with gymnasium, and the catalogue behind ``llm-gym list``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium

from llm_gym.errors import InvalidArgumentError, UnknownNameError

__all__ = ["EnvEntry", "env_entry", "register_builtin_envs", "register_env", "registered_envs"]

TEXT_ENV_ENTRY_POINT = "llm_gym.gym.text_env:TextEnv"


@dataclass(frozen=True)
class EnvEntry:
    """One registered environment, as ``llm-gym list`` shows it."""

    id: str
    """The gymnasium id, ``Name-vN``."""
    description: str
    """One line: what the agent has to do."""
    env: str | Callable[..., Any]
    """The async Env (class, factory or ``"module:attr"``)."""
    tasks: Any
    """The task source (``"module:attr"`` of a callable ``split -> tasks``, or the tasks)."""
    version: str
    """The environment's version; every record written about it carries it."""
    oracle: str | Callable[..., Any] | None
    """The scripted expert ``(task, messages) -> Message``, if any."""
    kwargs: dict[str, Any]
    """The keyword arguments ``gym.make`` passes to ``TextEnv``."""


_CATALOGUE: dict[str, EnvEntry] = {}


def register_env(
    id: str,
    *,
    env: str | Callable[..., Any],
    tasks: Any,
    description: str = "",
    action_format: str = "hermes",
    max_turns: int = 8,
    oracle: str | Callable[..., Any] | None = None,
    version: str = "0",
    **kwargs: Any,
) -> EnvEntry:
    """Register an async :class:`~llm_gym.core.Env` with gymnasium as a :class:`TextEnv`.

    Use string entry points (``"package.module:attr"``) for ``env``, ``tasks`` and ``oracle`` so
    that registration imports nothing heavy. Registering an id twice with the same settings is a
    no-op; with different settings it raises.

    Example:
        >>> import gymnasium as gym
        >>> _ = register_env("MyMath-v0", env="llm_gym.envs.tool_use_game:ToolUseGameEnv",
        ...                  tasks="llm_gym.envs.tool_use_game:get_tasks")
        >>> gym.make("MyMath-v0").unwrapped.max_turns
        8
    """
    if not isinstance(id, str) or "-v" not in id:
        raise InvalidArgumentError(f"Expected an id of the form 'Name-vN', actual value: {id!r}.")
    make_kwargs = {
        "env": env,
        "tasks": tasks,
        "action_format": action_format,
        "max_turns": max_turns,
        "oracle": oracle,
        "version": version,
        **kwargs,
    }
    entry = EnvEntry(id, description, env, tasks, version, oracle, make_kwargs)
    previous = _CATALOGUE.get(id)
    if previous is not None:
        if previous == entry:
            return previous
        raise InvalidArgumentError(
            f"{id!r} is already registered with other settings; pick a new version, e.g. "
            f"{id.rsplit('-v', 1)[0]}-v{_next_version(id)}."
        )
    _CATALOGUE[id] = entry
    if id not in gymnasium.registry:
        # TextEnv enforces reset-before-step itself and passes check_env (tested for every
        # registered id), so gym.make adds neither wrapper to the hot path by default;
        # gym.make(id, disable_env_checker=False) still adds the passive checker.
        gymnasium.register(
            id=id,
            entry_point=TEXT_ENV_ENTRY_POINT,
            kwargs=make_kwargs,
            order_enforce=False,
            disable_env_checker=True,
        )
    return entry


def _next_version(id: str) -> int:
    try:
        return int(id.rsplit("-v", 1)[1]) + 1
    except ValueError:
        return 1


def registered_envs() -> list[EnvEntry]:
    """Every environment registered through :func:`register_env`, sorted by id."""
    return [_CATALOGUE[k] for k in sorted(_CATALOGUE)]


def env_entry(env_id: str) -> EnvEntry:
    """The catalogue entry of ``env_id``; an unknown id suggests the closest registered one."""
    if env_id in _CATALOGUE:
        return _CATALOGUE[env_id]
    close = difflib.get_close_matches(env_id, list(_CATALOGUE), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(
        f"No llm_gym environment {env_id!r}.{hint} Registered: {sorted(_CATALOGUE)}."
    )


def register_builtin_envs() -> None:
    """Register llm_gym's own environments (idempotent; also the ``gymnasium.envs`` entry point).

    Every entry point is a ``"module:attr"`` string, so registering imports no environment code.
    Each environment package ``llm_gym.envs.<name>`` exposes its env, ``get_tasks(split)`` and
    ``oracle_action(task, messages)``.
    """
    register_env(
        "ToolUseGame-v0",
        env="llm_gym.envs.tool_use_game:ToolUseGameEnv",
        tasks="llm_gym.envs.tool_use_game:get_tasks",
        oracle="llm_gym.envs.tool_use_game:oracle_action",
        description="Answer questions about fictional towns with list_fact_keys, lookup and a "
        "calculator.",
        max_turns=8,
        version="0",
    )
    for name, module, env_class, max_turns, description in _BUILTIN_ENVS:
        register_env(
            name,
            env=f"llm_gym.envs.{module}:{env_class}",
            tasks=f"llm_gym.envs.{module}:get_tasks",
            oracle=f"llm_gym.envs.{module}:oracle_action",
            description=description,
            max_turns=max_turns,
            version="0",
        )


_BUILTIN_ENVS: tuple[tuple[str, str, str, int, str], ...] = (
    # id, package under llm_gym.envs, env attribute, loop turn limit, one-line description
    ("GuessNumber-v0", "guess_number", "GuessNumberEnv", 12,
     "Find a secret integer in a range from higher/lower feedback (per-turn rewards)."),
    ("Math-v0", "math", "MathEnv", 6,
     "Solve arithmetic word problems with a calculator tool; exact answers."),
    ("Wordle-v0", "wordle", "WordleEnv", 10,
     "Guess a five-letter word in six tries from per-letter feedback (invalid words cost no try)."),
    ("Refund-v0", "refund", "RefundEnv", 12,
     "Customer service on a stateful store API: authenticate, inspect orders, refund within "
     "policy."),
    ("SQL-v0", "sql", "SQLEnv", 8,
     "Answer questions about a per-task SQLite database through a read-only query tool."),
    ("Code-v0", "code", "CodeEnv", 6,
     "Write a Python function that passes hidden tests; code runs in a sandboxed process."),
    ("Maze-v0", "maze", "MazeEnv", 40,
     "Reach the goal of a text grid under partial observation with look and move tools."),
)
