"""Pure functions for evaluation numbers: intervals, pass@k and episode summaries."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.env import TruncationCause
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "format_rate",
    "wilson_interval",
    "paired_difference_interval",
    "pass_at_k",
    "mean_pass_at_k",
    "summarize_episodes",
    "success_by_type",
    "episode_succeeded",
    "is_success",
]


def format_rate(value: float, digits: int = 3) -> str:
    """``value`` (a rate: episodes or tokens per second) to ``digits`` significant figures, so
    that a positive rate never reads as zero; whole numbers once it has more integer digits
    than that, and scientific notation below a thousandth.

    Example:
        >>> [format_rate(v) for v in (0.0123456, 0.16, 9.996, 52.3456, 1234.5, 0.0)]
        ['0.0123', '0.160', '10.0', '52.3', '1234', '0']
        >>> format_rate(0.00004567), format_rate(float("inf"))
        ('4.57e-05', 'inf')
    """
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)  # inf, nan
    if abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    value = round(value, places)  # 9.996 -> 10.0: one integer digit more, one place less
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{places}f}"


def wilson_interval(successes: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default).

    Example:
        >>> lo, hi = wilson_interval(8, 10)
        >>> round(lo, 3), round(hi, 3)
        (0.49, 0.943)
    """
    if total < 0 or not 0 <= successes <= total:
        raise InvalidArgumentError(
            f"Expected 0 <= successes <= total, actual values: {successes}, {total}."
        )
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == total else min(1.0, centre + half)
    return low, high


def paired_difference_interval(
    before: Sequence[float], after: Sequence[float], z: float = 1.959964
) -> tuple[float, float, float]:
    """Mean of ``after - before`` over paired runs of the same tasks, with a normal 95% interval.

    Returns ``(mean, low, high)``. Pairing removes the tasks' own difficulty from the noise,
    so a gain on the same held-out tasks is measured much more tightly than two separate rates.

    Example:
        >>> mean, low, high = paired_difference_interval([0, 0, 1, 1], [1, 1, 1, 1])
        >>> mean, round(low, 3), round(high, 3)
        (0.5, -0.066, 1.066)
    """
    if len(before) != len(after) or not before:
        raise InvalidArgumentError(
            f"Expected two equally long, non-empty sequences, got {len(before)} and {len(after)}."
        )
    diffs = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return mean, mean - half, mean + half


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): the chance that k of n samples, c correct, hold one.

    ``1 - C(n - c, k) / C(n, k)``, computed as a stable product.

    Example:
        >>> pass_at_k(n=4, c=1, k=2)
        0.5
    """
    if not 0 <= c <= n:
        raise InvalidArgumentError(f"Expected 0 <= c <= n, actual values: c={c}, n={n}.")
    if not 1 <= k <= n:
        raise InvalidArgumentError(f"Expected 1 <= k <= n, actual values: k={k}, n={n}.")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_pass_at_k(per_task: Sequence[tuple[int, int]], k: int) -> float:
    """Mean pass@k over tasks given ``(n, c)`` per task."""
    if not per_task:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in per_task) / len(per_task)


def episode_succeeded(
    reward: float, metrics: Mapping[str, Any] | None = None, threshold: float = 1.0
) -> bool:
    """Whether an episode succeeded, by its environment's own judgement.

    ``reward`` and ``metrics`` are the environment's, from the step that ended the episode (an
    :class:`~llm_gym.rollout.Episode`'s ``reward`` and ``metrics``: ``failed_parse_reward`` on a
    parse failure, 0.0 when the loop cut the episode short or the environment raised). Reward
    shaping (the soft overlong penalty) and a trainer's reward functions never enter this test.

    The environment's ``metrics["success"]`` decides when it is a flag: a bool, or the number 0
    or 1 (a flag that went through JSON). Anything else there (absent, NaN, 0.5, text) is no
    flag, and the episode succeeded when ``reward >= threshold``.

    Evaluation's success rate and rejection sampling's choice of episodes both use this test.

    Example:
        >>> episode_succeeded(1.0), episode_succeeded(0.9)
        (True, False)
        >>> episode_succeeded(0.4, {"success": True})
        True
        >>> episode_succeeded(1.0, {"success": 0}), episode_succeeded(1.0, {"success": "no"})
        (False, True)
    """
    flag = metrics.get("success") if metrics else None
    if isinstance(flag, bool):
        return flag
    if isinstance(flag, int | float) and flag in (0, 1):
        return bool(flag)
    return reward >= threshold


def is_success(episode: Any, threshold: float = 1.0) -> bool:
    """:func:`episode_succeeded` for an episode record (its ``reward`` and ``metrics``)."""
    return episode_succeeded(episode.reward, episode.metrics, threshold)


MAX_REPORTED_COUNT = 10**9
"""The largest tool count an env's metrics may report (a larger one is not a count)."""


def _reported_count(value: Any) -> int | None:
    """``value`` when it is a count (a whole number in ``[0, MAX_REPORTED_COUNT]``), else None.

    Example:
        >>> _reported_count(3), _reported_count(2.0), _reported_count(-1), _reported_count("3")
        (3, 2, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value <= MAX_REPORTED_COUNT or value != int(value):  # NaN fails the range
        return None
    return int(value)


def _tool_counts(episode: Any) -> tuple[int, int]:
    """(tool calls, tool errors) of an episode. The loop counts structured calls; an env that
    parses its own text actions (``raw_text_actions``, e.g. document 002's) reports them in its
    final metrics as ``tool_calls`` / ``tool_errors``, which count when the loop saw none and
    they are counts (:func:`_reported_count`; errors at most the calls). Whatever else an env
    reports there (text, a list, a 400-digit number from a remote env) is not read."""
    calls, errors = episode.tool_calls, episode.tool_errors
    metrics = getattr(episode, "metrics", None) or {}
    reported = _reported_count(metrics.get("tool_calls"))
    if not calls and reported is not None:
        calls = reported
        errors = min(_reported_count(metrics.get("tool_errors", errors)) or 0, calls)
    return calls, errors


_NOT_THE_ENV = (TruncationCause.POLICY_ERROR, TruncationCause.TEMPLATE, TruncationCause.TOKENIZER)
"""Endings whose error is the policy's, the chat template's or the tokenizer's."""


def summarize_episodes(episodes: Sequence[Any], threshold: float = 1.0) -> dict[str, float]:
    """The per-episode averages a report and a training log show.

    Keys: ``reward_mean``, ``reward_std``, ``success_rate``, ``success_ci_low``,
    ``success_ci_high``, ``terminated_ratio``, ``truncated_ratio``, one ``<cause>_ratio`` per
    :class:`TruncationCause` (plus ``env_truncated_ratio`` as an alias of ``env_ratio``),
    ``turns_mean``, ``tool_calls_mean``, ``tool_error_rate`` (errors per tool call),
    ``tool_errors_mean``, ``env_error_ratio`` (reset/step/close raised; a policy's error counts in
    ``policy_error_ratio`` instead, a chat template's in ``template_ratio``, a tokenizer's in
    ``tokenizer_ratio``), ``completion_tokens_mean``,
    ``prompt_tokens_mean``, ``episodes``.
    """
    n = len(episodes)
    if n == 0:
        return {"episodes": 0.0}
    rewards = [float(e.reward) for e in episodes]
    mean = sum(rewards) / n
    successes = sum(is_success(e, threshold) for e in episodes)
    low, high = wilson_interval(successes, n)
    counts = [_tool_counts(e) for e in episodes]
    tool_calls = sum(calls for calls, _ in counts)
    tool_errors = sum(errors for _, errors in counts)
    summary = {
        "episodes": float(n),
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
        "success_rate": successes / n,
        "success_ci_low": low,
        "success_ci_high": high,
        "terminated_ratio": sum(e.terminated for e in episodes) / n,
        "truncated_ratio": sum(e.truncated for e in episodes) / n,
        "turns_mean": sum(e.num_turns for e in episodes) / n,
        "tool_calls_mean": tool_calls / n,
        "tool_errors_mean": tool_errors / n,
        "tool_error_rate": tool_errors / tool_calls if tool_calls else 0.0,
        "env_error_ratio": sum(
            e.error is not None and e.truncation_cause not in _NOT_THE_ENV for e in episodes
        )
        / n,
        "completion_tokens_mean": sum(e.completion_tokens for e in episodes) / n,
        "prompt_tokens_mean": sum(e.prompt_tokens for e in episodes) / n,
    }
    for cause in TruncationCause:
        summary[f"{cause.value}_ratio"] = sum(e.truncation_cause is cause for e in episodes) / n
    summary["env_truncated_ratio"] = summary["env_ratio"]
    return summary


def success_by_type(episodes: Sequence[Any], threshold: float = 1.0) -> dict[str, dict[str, float]]:
    """Success per kind of task, for tasks that name theirs (``task.metadata["type"]``, a
    string: ToolUseGame's ``lookup``, ``compare``, ...): ``{type: {"episodes": n,
    "success_rate": r}}`` in sorted order; empty when no task names one. A mean over the whole
    split can hide that all the successes are on one easy kind.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> def ep(kind, reward):
        ...     return NS(task=NS(metadata={"type": kind}), reward=reward, metrics={})
        >>> success_by_type([ep("a", 1.0), ep("a", 0.0), ep("b", 0.0)])
        {'a': {'episodes': 2.0, 'success_rate': 0.5}, 'b': {'episodes': 1.0, 'success_rate': 0.0}}
    """
    kinds: dict[str, list[bool]] = {}
    for episode in episodes:
        kind = getattr(getattr(episode, "task", None), "metadata", {}).get("type")
        if isinstance(kind, str):
            kinds.setdefault(kind, []).append(is_success(episode, threshold))
    return {
        kind: {"episodes": float(len(hits)), "success_rate": sum(hits) / len(hits)}
        for kind, hits in sorted(kinds.items())
    }
