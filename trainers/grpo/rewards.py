"""TRL-style reward functions on top of the environment's reward.

A reward function is what TRL's ``GRPOTrainer(reward_funcs=...)`` takes: a callable
``f(prompts, completions, **kwargs) -> list[float | None]``, one value per sample. Here a sample is
a whole episode, so each function sees, for every episode of a group:

- ``prompts``: the opening messages (system prompt, task);
- ``completions``: the rest of the conversation (assistant turns, tool results, env replies);
- keyword columns ``tasks`` (the ``Task`` s), ``targets``, ``env_rewards`` (the environment's
  reward after reward shaping), ``episodes`` (the ``Episode`` records) and ``trainer_state``.

The reward that enters the advantage is::

    reward = env_reward + sum_k reward_weights[k] * f_k(...)

with ``reward_weights`` (TRL's field, one weight per function; default all 1). ``None`` or NaN
from a function adds nothing for that episode (TRL's ``nansum``); anything else that is not a
finite number is refused, naming the function.

The config's ``judge`` adds one more function, a :class:`~llm_gym.judge.JudgeReward` weighted by
its settings' ``weight``, called once per group (so its ``group`` mode ranks each group in one
request). Every :class:`~llm_gym.judge.JudgeReward` among the functions logs its ``judge/...``
counters once per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.judge import JudgeReward
from trainers.grpo.metrics import split_conversation

__all__ = ["GroupRewards", "RewardFunc", "check_reward_funcs", "combined_rewards"]

RewardFunc = Callable[..., Sequence[float | None]]


def check_reward_funcs(reward_funcs: Any) -> list[RewardFunc]:
    """``reward_funcs`` as a list of callables (one callable, a list, or None)."""
    if reward_funcs is None:
        return []
    funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for func in funcs:
        if not callable(func):
            raise InvalidArgumentError(
                "reward_funcs must be callables f(prompts, completions, **kwargs) -> list of "
                f"floats (reward models by name are not supported here), actual value: {func!r}."
            )
    return funcs


def combined_rewards(
    env_rewards: Sequence[float],
    episodes: Sequence[Any],
    funcs: Sequence[RewardFunc],
    weights: Sequence[float],
    **columns: Any,
) -> tuple[list[float], list[list[float]]]:
    """``env_reward + sum_k weights[k] * f_k`` per episode, and each function's values (NaN
    where it gave none).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> ep = NS(messages=[{"role": "user", "content": "q"},
        ...                   {"role": "assistant", "content": "short"}],
        ...         num_opening_messages=1, task=NS(target=None))
        >>> def brevity(prompts, completions, **kwargs):
        ...     return [-len(c[-1]["content"]) / 10 for c in completions]
        >>> combined_rewards([1.0], [ep], [brevity], [2.0])
        ([0.0], [[-0.5]])
    """
    if len(weights) != len(funcs):
        raise InvalidArgumentError(
            f"Expected one reward weight per reward function ({len(funcs)}), got {len(weights)}."
        )
    split = [split_conversation(e) for e in episodes]
    prompts, completions = [p for p, _ in split], [c for _, c in split]
    kwargs = {
        "tasks": [e.task for e in episodes],
        "targets": [getattr(e.task, "target", None) for e in episodes],
        "env_rewards": list(env_rewards),
        "episodes": list(episodes),
        **columns,
    }
    totals = [float(r) for r in env_rewards]
    per_func: list[list[float]] = []
    for func, weight in zip(funcs, weights, strict=True):
        name = getattr(func, "__name__", type(func).__name__)
        values = list(func(prompts=prompts, completions=completions, **kwargs))
        if len(values) != len(episodes):
            raise InvalidArgumentError(
                f"Reward function {name} returned {len(values)} values for {len(episodes)} "
                "episodes; expected one per episode."
            )
        column = []
        for i, value in enumerate(values):
            if value is None or (isinstance(value, float) and math.isnan(value)):
                column.append(math.nan)
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise InvalidArgumentError(
                    f"Reward function {name} returned {value!r} for episode {i}; expected a "
                    "finite number, None or NaN."
                )
            column.append(float(value))
            totals[i] += float(weight) * float(value)
        per_func.append(column)
    return totals, per_func


class GroupRewards:
    """The rewards a group's advantages come from (see the module docstring).

    Args:
        config: The run's config (reward shaping fields and ``judge``).
        funcs, weights: The user's reward functions and their weights (TRL's ``reward_funcs``
            and ``reward_weights``, kept apart from the placeholder TRL requires when there is
            none).
    """

    def __init__(self, config: Any, funcs: Sequence[RewardFunc], weights: Sequence[float]) -> None:
        if len(weights) != len(funcs):
            raise InvalidArgumentError(
                f"Expected one reward weight per reward function ({len(funcs)}), "
                f"got {len(weights)}."
            )
        self.config = config
        self.funcs = [*funcs]
        self.weights = [float(w) for w in weights]
        self.judge = JudgeReward(config.judge) if config.judge is not None else None

    def shaped(self, episode: Any) -> float:
        """The episode's environment reward after reward shaping (failed parse, overlong)."""
        from trainers.grpo.advantages import shaped_reward

        config = self.config
        return shaped_reward(
            episode.reward,
            episode.truncation_cause,
            episode.total_tokens,
            max_model_length=config.max_model_length,
            overlong_buffer=config.overlong_buffer,
            overlong_penalty_factor=config.overlong_penalty_factor,
            max_new_tokens=config.max_tokens_per_turn,
        )

    def extra(self) -> tuple[list[RewardFunc], list[float]]:
        """The functions added to the environment's reward and their weights: the user's,
        then the config's judge."""
        if self.judge is None:
            return list(self.funcs), list(self.weights)
        return [*self.funcs, self.judge], [*self.weights, self.judge.settings.weight]

    def __call__(
        self, group: Sequence[Any], trainer_state: Any, metrics: dict[str, list[float]]
    ) -> list[float]:
        """Each episode's reward; each function's mean over the group's finite values is
        appended to ``metrics["rewards/<name>/mean"]``."""
        env_rewards = [self.shaped(e) for e in group]
        funcs, weights = self.extra()
        if not funcs:
            return env_rewards
        totals, per_func = combined_rewards(
            env_rewards, group, funcs, weights, trainer_state=trainer_state
        )
        for func, values in zip(funcs, per_func, strict=True):
            finite = [v for v in values if not math.isnan(v)]
            if finite:
                name = getattr(func, "__name__", type(func).__name__)
                metrics[f"rewards/{name}/mean"].append(sum(finite) / len(finite))
        return totals

    def judge_metrics(self) -> dict[str, float]:
        """Every judge's ``judge/...`` counters since the last call (this process's)."""
        out: dict[str, float] = {}
        for func in self.extra()[0]:
            if isinstance(func, JudgeReward):
                out.update(func.take_metrics())
        return out
