"""``register_env``: an environment into llm_gym's catalogue and gymnasium's registry at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

from llm_gym.core.registry import EnvEntry, add_env_entry, remove_env_entry
from llm_gym.errors import InvalidArgumentError

__all__ = ["register_env", "unregister_env"]

TEXT_ENV_ENTRY_POINT = "llm_gym.gym.text_env:TextEnv"


def register_env(
    id: str,
    *,
    env: str | Callable[..., Any],
    tasks: Any,
    description: str = "",
    action_format: str = "hermes",
    pin_action_format: bool = False,
    max_turns: int = 8,
    max_tokens_per_turn: int | None = None,
    oracle: str | Callable[..., Any] | None = None,
    version: str = "0",
    entry_point: str = TEXT_ENV_ENTRY_POINT,
    **kwargs: Any,
) -> EnvEntry:
    """Register an async :class:`~llm_gym.core.Env` with gymnasium as a :class:`TextEnv`.

    Use string entry points (``"package.module:attr"``) for ``env``, ``tasks`` and ``oracle`` so
    that registration imports nothing heavy. Registering an id twice with the same settings is a
    no-op; with different settings it raises. ``entry_point`` is what ``gym.make`` builds:
    :class:`TextEnv`, or a subclass of it (``"module:Class"``) that takes more keywords
    (``ReasoningGym-v0``'s ``dataset=``); everything else reads the catalogue entry.
    ``action_format`` is the env's format; a model policy whose chat template teaches another
    (Llama 3's JSON, Mistral's ``[TOOL_CALLS]``, ...) gets that one unless
    ``pin_action_format`` (:attr:`~llm_gym.core.EnvEntry.requested_action_format`).

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
    entry = add_env_entry(
        EnvEntry(
            id,
            description,
            env,
            tasks,
            version,
            oracle,
            make_kwargs,
            max_tokens_per_turn,
            action_format_pinned=bool(pin_action_format),
        )
    )
    if id not in gymnasium.registry:
        # TextEnv enforces reset-before-step itself and passes check_env (tested for every
        # registered id), so gym.make adds neither wrapper to the hot path by default;
        # gym.make(id, disable_env_checker=False) still adds the passive checker.
        gymnasium.register(
            id=id,
            entry_point=entry_point,
            kwargs=make_kwargs,
            order_enforce=False,
            disable_env_checker=True,
        )
    return entry


def unregister_env(id: str) -> None:
    """Remove ``id`` from llm_gym's catalogue and gymnasium's registry (no error when absent):
    for tests and notebooks that register throwaway ids."""
    remove_env_entry(id)
    gymnasium.registry.pop(id, None)
