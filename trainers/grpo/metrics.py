"""The metrics the trainer logs for a GRPO step's rollouts and for a validation run.

Pure assembly from episodes (:func:`llm_gym.eval.summarize_episodes`) into the logged names:
``reward`` and ``reward_std`` as TRL names them; the seeds' episode ratios bare, as the seeds tell
users to watch them (:data:`SEED_EPISODE_KEYS`, ``zero_variance_skip_ratio``); the step's other
episode metrics under ``episodes/``, the wall-clock split under ``timing/``, validation under
``val/``; in a mixture of environments each one's under ``env/<name>/`` (:func:`env_metrics`)
and ``val/<name>/``. ``docs/metrics.md`` lists every key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from llm_gym.eval.metrics import summarize_episodes

__all__ = [
    "capped_turn_ratio",
    "completion_rows",
    "split_conversation",
    "extend_completion_logs",
    "SEED_EPISODE_KEYS",
    "EPISODE_KEYS",
    "ENV_KEYS",
    "env_metrics",
    "VALIDATION_KEYS",
    "RolloutPart",
    "rollout_metrics",
    "validation_metrics",
]

SEED_EPISODE_KEYS = (
    "terminated_ratio",
    "truncated_ratio",
    "context_overflow_ratio",
    "parse_failure_ratio",
)
"""The keys of :func:`~llm_gym.eval.summarize_episodes` logged under their own names each step,
as the seeds spell them."""

EPISODE_KEYS = (
    "max_turns_ratio",
    "env_truncated_ratio",
    "deadline_ratio",
    "policy_error_ratio",
    "template_ratio",
    "tokenizer_ratio",
    "success_rate",
    "turns_mean",
    "tool_calls_mean",
    "tool_error_rate",
    "completion_tokens_mean",
)
"""The keys of :func:`~llm_gym.eval.summarize_episodes` logged as ``episodes/<key>`` each step."""

VALIDATION_KEYS = (
    "success_rate",
    "success_ci_low",
    "success_ci_high",
    "reward_mean",
    "turns_mean",
    "parse_failure_ratio",
    "tool_error_rate",
)
"""The keys of a validation summary logged as ``val/<key>``."""


ENV_KEYS = (
    "reward_mean",
    "success_rate",
    "truncated_ratio",
    "max_turns_ratio",
    "context_overflow_ratio",
    "parse_failure_ratio",
    "turns_mean",
    "completion_tokens_mean",
)
"""The keys of :func:`~llm_gym.eval.summarize_episodes` logged per environment of a mixture
(``env/<name>/<key>``, ``reward_mean`` as ``env/<name>/reward``)."""


def env_metrics(episodes: Sequence[Any]) -> dict[str, float]:
    """Per environment of a mixture (``episode.env_id``; episodes without one are left out):
    :data:`ENV_KEYS` as ``env/<name>/<key>``, its episode count and its share of the episodes.

    Example:
        >>> from llm_gym.rollout import Episode
        >>> from llm_gym import Task
        >>> def episode(env, reward):
        ...     return Episode(Task(prompt="q"), 0, 0, [], [], reward, True, False, env_id=env)
        >>> m = env_metrics([episode("a", 1.0), episode("a", 0.0), episode("b", 0.5)])
        >>> m["env/a/reward"], m["env/a/episodes"], m["env/a/share"], m["env/b/reward"]
        (0.5, 2.0, 0.6666666666666666, 0.5)
    """
    by_env: dict[str, list[Any]] = {}
    for episode in episodes:
        if episode.env_id is not None:
            by_env.setdefault(episode.env_id, []).append(episode)
    total = sum(len(group) for group in by_env.values())
    metrics: dict[str, float] = {}
    for name, group in sorted(by_env.items()):
        summary = summarize_episodes(group)
        for key in ENV_KEYS:
            metrics[f"env/{name}/{'reward' if key == 'reward_mean' else key}"] = summary[key]
        metrics[f"env/{name}/episodes"] = float(len(group))
        metrics[f"env/{name}/share"] = len(group) / total
    return metrics


RolloutPart: TypeAlias = tuple[list[Any], list[float], int, int, int]
"""One process's share of a step's rollouts, gathered over processes: the episodes of the groups
that went into the batch, their shaped rewards (in the same order), the groups collected
(dynamic-sampling refills included), the collected groups without a learning signal that dynamic
sampling set aside (GRPO: their shaped rewards are all equal; RFT: no episode succeeded), and
the token samples dropped over ``max_samples_per_episode``."""


def rollout_metrics(
    parts: Sequence[RolloutPart], rollout_seconds: float, train_seconds: float
) -> dict[str, float]:
    """A step's rollout metrics from every process's part.

    Args:
        parts: The gathered parts (:data:`RolloutPart`).
        rollout_seconds: This process's collection time.
        train_seconds: Time since the previous collection ended (NaN on the first step: not
            logged).
    """
    episodes: list[Any] = []
    shaped: list[float] = []
    collected_groups = zero_variance = dropped = 0
    for part_episodes, part_shaped, collected, set_aside, lost in parts:
        episodes += part_episodes
        shaped += part_shaped
        collected_groups, zero_variance = collected_groups + collected, zero_variance + set_aside
        dropped += lost
    summary = summarize_episodes(episodes)
    metrics = {key: summary[key] for key in SEED_EPISODE_KEYS}
    metrics.update({f"episodes/{key}": summary[key] for key in EPISODE_KEYS})
    metrics["reward"] = summary["reward_mean"]
    metrics["reward_std"] = summary["reward_std"]
    metrics["episodes/shaped_reward_mean"] = sum(shaped) / max(1, len(shaped))
    metrics["episodes/capped_turn_ratio"] = capped_turn_ratio(episodes)
    metrics["zero_variance_skip_ratio"] = zero_variance / max(1, collected_groups)
    metrics["episodes/dropped_samples"] = dropped
    metrics.update(env_metrics(episodes))
    metrics["timing/rollout_seconds"] = rollout_seconds
    if train_seconds == train_seconds:  # not NaN: there was a previous step
        metrics["timing/train_seconds"] = train_seconds
    return metrics


def capped_turn_ratio(episodes: Sequence[Any]) -> float:
    """The share of the episodes' assistant turns that stopped at the token cap
    (``finish_reason == "length"``); 0.0 without turns.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> turns = [NS(finish_reason="length"), NS(finish_reason="stop")]
        >>> capped_turn_ratio([NS(turns=turns), NS(turns=[NS(finish_reason="length")])])
        0.6666666666666666
    """
    turns = [turn for episode in episodes for turn in episode.turns]
    return sum(turn.finish_reason == "length" for turn in turns) / max(1, len(turns))


def validation_metrics(summary: Mapping[str, float], env: str | None = None) -> dict[str, float]:
    """A validation summary's logged metrics (the :data:`VALIDATION_KEYS` it has), under
    ``val/`` or, for environment ``env`` of a mixture, ``val/<env>/``.

    Example:
        >>> validation_metrics({"success_rate": 0.5, "reward_mean": 0.25, "episodes": 4.0})
        {'val/success_rate': 0.5, 'val/reward_mean': 0.25}
        >>> validation_metrics({"success_rate": 0.5}, env="GuessNumber-v0")
        {'val/GuessNumber-v0/success_rate': 0.5}
    """
    prefix = "val/" if env is None else f"val/{env}/"
    return {f"{prefix}{key}": summary[key] for key in VALIDATION_KEYS if key in summary}


def split_conversation(episode: Any) -> tuple[list[Any], list[Any]]:
    """An episode's opening messages (the prompt) and the rest of its conversation, copied."""
    opening = episode.num_opening_messages
    return [dict(m) for m in episode.messages[:opening]], [
        dict(m) for m in episode.messages[opening:]
    ]


def completion_rows(
    groups: Sequence[Sequence[Any]],
    rewards: Sequence[Sequence[float]],
    advantages: Sequence[Sequence[float]],
) -> dict[str, list[Any]]:
    """One row per episode for TRL's completions table (``log_completions``): its opening
    messages as the prompt, the rest of the conversation as the completion, the shaped reward,
    the episode's advantage and how it ended.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> episode = NS(messages=[{"role": "user", "content": "q"},
        ...                        {"role": "assistant", "content": "a"}],
        ...              num_opening_messages=1, truncation_cause=None)
        >>> rows = completion_rows([[episode]], [[1.0]], [[0.5]])
        >>> rows["completion"], rows["reward"], rows["advantage"], rows["ended"]
        ([[{'role': 'assistant', 'content': 'a'}]], [1.0], [0.5], ['terminated'])
    """
    rows: dict[str, list[Any]] = {k: [] for k in ("prompt", "completion", "reward", "advantage")}
    rows["ended"] = []
    for group, group_rewards, group_advantages in zip(groups, rewards, advantages, strict=True):
        for episode, reward, advantage in zip(group, group_rewards, group_advantages, strict=True):
            prompt, completion = split_conversation(episode)
            rows["prompt"].append(prompt)
            rows["completion"].append(completion)
            rows["reward"].append(float(reward))
            rows["advantage"].append(float(advantage))
            cause = episode.truncation_cause
            rows["ended"].append("terminated" if cause is None else str(cause.value))
    return rows


def extend_completion_logs(logs: Any, rows: Mapping[str, list[Any]], gather: Any) -> None:
    """Add :func:`completion_rows` (gathered over processes) to TRL's ``_logs``, which its
    ``log`` prints as a table and sends to W&B when ``log_completions`` is on."""
    logs["prompt"].extend(gather(rows["prompt"]))
    logs["completion"].extend(gather(rows["completion"]))
    logs["rewards"]["reward"].extend(gather(rows["reward"]))
    logs["advantages"].extend(gather(rows["advantage"]))
    logs["extra"]["ended"].extend(gather(rows["ended"]))
