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

__all__ = ["RewardFunc", "RewardsMixin", "check_reward_funcs", "combined_rewards"]

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


class RewardsMixin:
    """The rewards of :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer` (before TRL's
    ``GRPOTrainer`` in its bases): each episode's shaped environment reward, plus the user's
    reward functions (TRL keeps them in ``reward_funcs`` / ``reward_weights``)."""

    def _shaped(self, episode: Any) -> float:
        from trainers.grpo.advantages import shaped_reward

        args = self.args  # type: ignore[attr-defined]
        return shaped_reward(
            episode.reward,
            episode.truncation_cause,
            episode.total_tokens,
            max_model_length=args.max_model_length,
            overlong_buffer=args.overlong_buffer,
            overlong_penalty_factor=args.overlong_penalty_factor,
            max_new_tokens=args.max_tokens_per_turn,
        )

    _judge: JudgeReward | None = None

    def _extra_rewards(self) -> tuple[list[RewardFunc], list[float]]:
        """The reward functions added to the environment's reward, and their weights: the
        user's (TRL's ``reward_funcs`` / ``reward_weights``), then the config's ``judge``."""
        funcs = [f for f in self.reward_funcs if f.__name__ != "_unused_reward"]  # type: ignore[attr-defined]
        weights = self.reward_weights.tolist() if funcs else []  # type: ignore[attr-defined]
        settings = self.args.judge  # type: ignore[attr-defined]
        if settings is not None:
            if self._judge is None:
                self._judge = JudgeReward(settings)
            funcs.append(self._judge)
            weights.append(self._judge.settings.weight)
        return funcs, weights

    def _group_rewards(self, group: Sequence[Any]) -> list[float]:
        """The rewards a group's advantages come from (see the module docstring)."""
        env_rewards = [self._shaped(e) for e in group]
        funcs, weights = self._extra_rewards()
        if not funcs:
            return env_rewards
        totals, per_func = combined_rewards(
            env_rewards,
            group,
            funcs,
            weights,
            trainer_state=self.state,  # type: ignore[attr-defined]
        )
        mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
        for func, values in zip(funcs, per_func, strict=True):
            finite = [v for v in values if not math.isnan(v)]
            if finite:
                name = getattr(func, "__name__", type(func).__name__)
                self._metrics[mode][f"rewards/{name}/mean"].append(sum(finite) / len(finite))  # type: ignore[attr-defined]
        return totals

    def _log_judge_metrics(self, mode: str) -> None:
        """Each judge's ``judge/...`` counters since the last step (this process's)."""
        for func in self._extra_rewards()[0]:
            if isinstance(func, JudgeReward):
                for key, value in func.take_metrics().items():
                    self._metrics[mode][key].append(value)  # type: ignore[attr-defined]
