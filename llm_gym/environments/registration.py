"""``register_multi_turn_env``: a document-002 environment as a gymnasium id."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_gym.core.factories import trust_reference
from llm_gym.core.registry import EnvEntry
from llm_gym.environments.factory import MultiTurnEnvFactory, MultiTurnTaskSource
from llm_gym.gym.registration import register_env

__all__ = ["MAX_TURNS_CEILING", "register_multi_turn_env"]

MAX_TURNS_CEILING = 256
"""The loop's turn limit for registered document-002 environments when none is given: a safety
net only, since the environment's own ``max_episode_turns`` ends (and scores) the episode."""


def register_multi_turn_env(
    id: str,
    environment: Any,
    *,
    tasks: Any = None,
    prompt_text: str = "",
    environment_kwargs: Mapping[str, Any] | None = None,
    description: str = "",
    max_turns: int | None = None,
    version: str = "0",
    offload_hooks: bool = False,
    batch_scoring: bool = True,
    **kwargs: Any,
) -> EnvEntry:
    """Register an :class:`~llm_gym.environments.EnvironmentMultiTurn` with gymnasium.

    Afterwards ``gym.make(id)`` gives a :class:`~llm_gym.gym.TextEnv` over it, and ``id`` works
    in ``run_and_report``, ``llm-gym eval`` and the trainer like any registered environment.

    Args:
        id: The gymnasium id, ``Name-vN``.
        environment: The environment: ``"package.module:load_environment"`` (preferred: nothing
            is imported until first use), an ``EnvironmentMultiTurn`` subclass or instance, or a
            ``load_environment``-style function (called with ``split=`` when it accepts it).
        tasks: The tasks (a sequence, a mapping split -> tasks, a callable ``split -> tasks`` or a
            ``"module:attr"`` string). Default: the environment's own ``dataset`` attribute, read
            per split (rows with ``input``/``output`` keys, ``TaskExample`` s or ``Task`` s).
        prompt_text: Passed to ``start_episode``.
        environment_kwargs: Extra keyword arguments for the class or function.
        description: One line for ``llm-gym list``.
        max_turns: The loop's turn limit; default :data:`MAX_TURNS_CEILING`, because the
            environment's ``max_episode_turns`` decides (a lower value cuts episodes short; they
            are still scored).
        version: The environment's version.
        offload_hooks: Run synchronous hooks in worker threads.
        batch_scoring: Score each GRPO group with one ``score_episodes`` call once all its
            episodes have ended (False: one call per episode).
        **kwargs: More ``TextEnv`` keyword arguments (``failed_parse_reward``, ...).

    Returns:
        The catalogue entry.

    Example:
        >>> _ = register_multi_turn_env("MyAgent-v0", "my_package.environment:load_environment")
    """
    trust_reference(environment)  # registered from Python: resolves without trusting its module
    factory = MultiTurnEnvFactory(
        environment,
        prompt_text=prompt_text,
        environment_kwargs=environment_kwargs,
        offload_hooks=offload_hooks,
        batch_scoring=batch_scoring,
    )
    return register_env(
        id,
        env=factory,
        tasks=tasks if tasks is not None else MultiTurnTaskSource(factory),
        description=description,
        action_format="hermes",
        max_turns=max_turns if max_turns is not None else MAX_TURNS_CEILING,
        version=version,
        **kwargs,
    )
