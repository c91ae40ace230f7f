"""Reward shaping and group-relative advantages: pure functions on plain Python numbers.

Conventions: a *group* is the ``episodes_per_task`` episodes of one task. Shapes in names:
``G`` episodes in a group, ``T`` turns of one episode.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from llm_gym.core.env import TruncationCause
from llm_gym.errors import InvalidArgumentError, UnknownNameError, did_you_mean

__all__ = [
    "ScaleRewards",
    "soft_overlong_penalty",
    "shaped_reward",
    "group_advantages",
    "per_turn_group_advantages",
    "is_zero_variance",
    # estimators, by the name of the config's credit_assignment
    "Advantages",
    "AdvantageEstimator",
    "ADVANTAGE_ESTIMATORS",
    "advantage_estimator",
    "register_advantage_estimator",
    "per_episode_credit",
    "per_turn_credit",
    "refuse_per_turn_with_native_tools",
]

ScaleRewards = str
"""``"group"`` (divide by the group's std), ``"batch"`` (by the batch's std) or ``"none"``."""

EPSILON = 1e-4
"""Added to the standard deviation before dividing (TRL uses the same value)."""


def soft_overlong_penalty(length: int, max_length: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_length - buffer``, then a linear ramp down
    to ``-factor`` at ``max_length`` (and ``-factor`` beyond).

    Example:
        >>> soft_overlong_penalty(900, 1000, 200, 1.0)
        -0.5
    """
    if buffer <= 0 or buffer > max_length:
        raise InvalidArgumentError(
            f"buffer must be in (0, max_length={max_length}], actual value: {buffer}."
        )
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    return -factor * min(1.0, (length - expected) / buffer)


def shaped_reward(
    reward: float,
    truncation_cause: TruncationCause | None,
    total_tokens: int,
    *,
    max_model_length: int | None,
    overlong_buffer: int | None,
    overlong_penalty_factor: float,
    max_new_tokens: int = 0,
) -> float:
    """The reward that enters the advantage: the env's reward plus the soft overlong penalty.

    The arguments are an episode's (:class:`~llm_gym.rollout.Episode`'s ``reward``,
    ``truncation_cause`` and ``total_tokens``: its length in tokens when it ended).

    The penalty applies only to the two length-budget causes (``CONTEXT_OVERFLOW`` and
    ``MAX_TURNS``), never to ``ENV`` or ``PARSE_FAILURE``. ``CONTEXT_OVERFLOW`` is measured in
    tokens against ``max_model_length`` with a buffer of ``overlong_buffer`` tokens, at the length
    the episode needed: its tokens plus the turn budget (``max_new_tokens``) that no longer fit.
    So an overflow is penalised whatever the buffer is next to the turn budget (an overflow at
    1,800 of 2,048 tokens with a 256-token turn budget needs 2,056: the full factor).
    ``MAX_TURNS`` means the whole turn budget was used, the end of any buffer, so it gets the
    full ``-overlong_penalty_factor``. ``overlong_buffer=None`` turns the penalty off.

    Example:
        >>> shaped_reward(1.0, TruncationCause.CONTEXT_OVERFLOW, 1800, max_model_length=2048,
        ...               overlong_buffer=128, overlong_penalty_factor=1.0, max_new_tokens=256)
        0.0
        >>> shaped_reward(1.0, TruncationCause.MAX_TURNS, 300, max_model_length=2048,
        ...               overlong_buffer=128, overlong_penalty_factor=0.5)
        0.5
    """
    reward = float(reward)
    cause = truncation_cause
    if overlong_buffer is None or cause is None or not cause.gets_overlong_penalty:
        return reward
    if cause is TruncationCause.MAX_TURNS or max_model_length is None:
        return reward - overlong_penalty_factor
    buffer = min(overlong_buffer, max_model_length)
    length = total_tokens + max_new_tokens
    return reward + soft_overlong_penalty(length, max_model_length, buffer, overlong_penalty_factor)


def _require_finite(values_by_group: Sequence[Sequence[Any]], what: str) -> None:
    """Refuse NaN and infinities: one would turn its group's advantages (the batch's, under
    ``scale_rewards="batch"``) and the loss into NaN. The episode driver never lets an env's
    reach an episode; reward functions, their weights or a NaN config value still could."""
    for g, group in enumerate(values_by_group):
        for e, value in enumerate(group):
            if not math.isfinite(value):
                raise InvalidArgumentError(
                    f"{what}[{g}][{e}] is {value!r}; rewards and advantages must be finite. "
                    "Check the reward functions and reward_weights, overlong_penalty_factor "
                    "and failed_parse_reward, and that rewards are not huge (above ~1e150)."
                )


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    # Unbiased std, as torch.std (TRL's normaliser); 0 for a single value.
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var)


def is_zero_variance(rewards_G: Sequence[float], tolerance: float = 1e-9) -> bool:
    """True when every episode of a group got the same reward (no learning signal)."""
    return max(rewards_G) - min(rewards_G) <= tolerance


def group_advantages(
    groups: Sequence[Sequence[float]], scale_rewards: ScaleRewards = "group"
) -> list[list[float]]:
    """Per-episode credit: ``(r - mean_group) / (std + 1e-4)``, one value per episode.

    ``scale_rewards="batch"`` divides by the std over every episode of the batch instead, and
    ``"none"`` only centres (Dr. GRPO). Every reward of the group counts in its baseline,
    including episodes that will build no sample (overlong masking).

    Example:
        >>> group_advantages([[1.0, 0.0]], scale_rewards="none")
        [[0.5, -0.5]]
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise InvalidArgumentError(
            f"scale_rewards must be 'group', 'batch' or 'none', actual value: {scale_rewards!r}."
        )
    if any(len(g) == 0 for g in groups):
        raise InvalidArgumentError("Every group needs at least one episode.")
    _require_finite(groups, "rewards")
    batch_std = _mean_std([r for g in groups for r in g])[1] if scale_rewards == "batch" else 0.0
    out = []
    for rewards_G in groups:
        mean, std = _mean_std(rewards_G)
        scale = {"group": std, "batch": batch_std, "none": None}[scale_rewards]
        out.append(
            [(r - mean) / (scale + EPSILON) if scale is not None else r - mean for r in rewards_G]
        )
    _require_finite(out, "advantages")
    return out


def per_turn_group_advantages(
    groups: Sequence[Sequence[Sequence[float]]], scale_rewards: ScaleRewards = "group"
) -> list[list[list[float]]]:
    """Per-turn credit: every assistant turn gets its own group-relative advantage.

    ``groups[g][e][t]`` is the reward of turn ``t`` of episode ``e`` of group ``g``. The baseline
    (and the scale, for ``"group"``) is taken over every turn of every episode in the group, so
    a turn is compared with the turns its siblings took on the same task.

    Example:
        >>> out = per_turn_group_advantages([[[1.0, 0.0], [0.0]]], scale_rewards="none")
        >>> [[[round(a, 4) for a in turns] for turns in group] for group in out]
        [[[0.6667, -0.3333], [-0.3333]]]
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise InvalidArgumentError(
            f"scale_rewards must be 'group', 'batch' or 'none', actual value: {scale_rewards!r}."
        )
    for group in groups:
        _require_finite(group, "turn rewards")
    flat_batch = [r for g in groups for e in g for r in e]
    batch_std = _mean_std(flat_batch)[1] if scale_rewards == "batch" and flat_batch else 0.0
    out = []
    for group in groups:
        flat = [r for e in group for r in e]
        if not flat:
            out.append([[] for _ in group])
            continue
        mean, std = _mean_std(flat)
        scale = {"group": std, "batch": batch_std, "none": None}[scale_rewards]
        out.append(
            [
                [(r - mean) / (scale + EPSILON) if scale is not None else r - mean for r in e]
                for e in group
            ]
        )
        _require_finite(out[-1], "turn advantages")
    return out


# --- estimators ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advantages:
    """What an advantage estimator returns for a batch of groups."""

    episode: list[list[float]]
    """``episode[g][e]``: the advantage of episode ``e`` of group ``g`` (every token of it)."""
    turns: list[list[list[float] | None]]
    """``turns[g][e][t]``: the advantage of turn ``t``, or None where the episode uses
    :attr:`episode` for every turn."""


AdvantageEstimator: TypeAlias = Callable[
    [Sequence[Sequence[float]], Sequence[Sequence[Sequence[float] | None]], ScaleRewards],
    Advantages,
]
"""``(rewards[g][e], turn_rewards[g][e] or None, scale_rewards) -> Advantages``: the shaped
episode rewards, each episode's per-turn rewards when its environment graded every turn, and
TRL's ``scale_rewards``."""


def per_episode_credit(
    rewards: Sequence[Sequence[float]],
    turn_rewards: Sequence[Sequence[Sequence[float] | None]],
    scale_rewards: ScaleRewards = "group",
) -> Advantages:
    """Every turn of an episode shares the episode's group-relative advantage.

    Example:
        >>> per_episode_credit([[1.0, 0.0]], [[None, None]], "none").episode
        [[0.5, -0.5]]
    """
    return Advantages(group_advantages(rewards, scale_rewards), [[None] * len(g) for g in rewards])


def per_turn_credit(
    rewards: Sequence[Sequence[float]],
    turn_rewards: Sequence[Sequence[Sequence[float] | None]],
    scale_rewards: ScaleRewards = "group",
) -> Advantages:
    """Each turn gets its own advantage (:func:`per_turn_group_advantages`) in groups where every
    episode has per-turn rewards; other groups fall back to per-episode credit.

    Example:
        >>> out = per_turn_credit([[1.0, 0.0], [1.0, 0.0]], [[[1.0], [0.0]], [[1.0], None]], "none")
        >>> out.turns
        [[[0.5], [-0.5]], [None, None]]
    """
    credit = per_episode_credit(rewards, turn_rewards, scale_rewards)
    eligible: list[int] = []  # the groups where every episode has per-turn rewards
    complete: list[list[Sequence[float]]] = []
    for g, group in enumerate(turn_rewards):
        rewarded = [t for t in group if t is not None]
        if len(rewarded) == len(group):
            eligible.append(g)
            complete.append(rewarded)
    computed = per_turn_group_advantages(complete, scale_rewards)
    for g, values in zip(eligible, computed, strict=True):
        turns: list[list[float] | None] = list(values)
        credit.turns[g] = turns
    return credit


VOID_CAUSES = frozenset(cause for cause in TruncationCause if cause.is_void)
"""Endings that are the infrastructure's doing, not the policy's: a failed policy endpoint, a
generation that missed its deadline twice. Such episodes neither train nor enter a baseline."""


def without_void_episodes(
    groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]
) -> tuple[list[list[Any]], list[list[float]]]:
    """The groups and their rewards without the episodes a :data:`VOID_CAUSES` ending cut short
    (a group left empty is dropped).

    Example:
        >>> from types import SimpleNamespace as E
        >>> ok, failed = E(truncation_cause=None), E(truncation_cause=TruncationCause.POLICY_ERROR)
        >>> without_void_episodes([[ok, failed], [failed]], [[1.0, 0.0], [0.0]])[1]
        [[1.0]]
    """
    kept_groups, kept_rewards = [], []
    for group, group_rewards in zip(groups, rewards, strict=True):
        pairs = [
            (e, r)
            for e, r in zip(group, group_rewards, strict=True)
            if e.truncation_cause not in VOID_CAUSES
        ]
        if pairs:
            kept_groups.append([e for e, _ in pairs])
            kept_rewards.append([r for _, r in pairs])
    return kept_groups, kept_rewards


def warn_per_turn_fallback(groups: Sequence[Sequence[Any]]) -> int:
    """Warn (document 002) when per-turn credit fell back to episode credit for a group because
    an episode of more than one turn has no ``per_turn_rewards`` (a one-turn episode's credit is
    the same either way: no warning); returns how many groups fell back."""
    fell_back = sum(
        1
        for group in groups
        if any(e.per_turn_rewards is None for e in group) and any(len(e.turns) > 1 for e in group)
    )
    if fell_back:
        warnings.warn(
            f"credit_assignment='per_turn': {fell_back} group(s) have multi-turn episodes without "
            "per_turn_rewards (one finite value per assistant turn, in the score's metadata); "
            "they use episode-level credit.",
            stacklevel=2,
        )
    return fell_back


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "per_episode": per_episode_credit,
    "per_turn": per_turn_credit,
}
"""Every estimator by name; ``MultiTurnGRPOConfig.credit_assignment`` picks one of these."""


def register_advantage_estimator(name: str, estimator: AdvantageEstimator) -> None:
    """Make ``estimator`` selectable as ``credit_assignment=name``. The same name again with
    the same function is a no-op; with another function it raises (pick a new name)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidArgumentError(f"Expected an identifier as the name, actual value: {name!r}.")
    if not callable(estimator):
        raise InvalidArgumentError(f"Expected a callable estimator, actual value: {estimator!r}.")
    previous = ADVANTAGE_ESTIMATORS.get(name)
    if previous is not None and previous is not estimator:
        raise InvalidArgumentError(
            f"credit_assignment {name!r} is already {previous.__qualname__}; pick another name."
        )
    ADVANTAGE_ESTIMATORS[name] = estimator


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; an unknown name suggests the closest one."""
    if name in ADVANTAGE_ESTIMATORS:
        return ADVANTAGE_ESTIMATORS[name]
    raise UnknownNameError(
        f"credit_assignment must be one of {sorted(ADVANTAGE_ESTIMATORS)}, actual value: "
        f"{name!r}.{did_you_mean(name, ADVANTAGE_ESTIMATORS)} Add one with "
        "trainers.grpo.advantages.register_advantage_estimator."
    )


def refuse_per_turn_with_native_tools(env_factory: Callable[[Any], Any], task: Any) -> None:
    """Document 002: per-turn credit is rejected for native tool-calling environments (an env
    that offers tools and parses structured calls), before training starts."""
    env = env_factory(task)
    specs = getattr(env, "tool_specs", None) or []
    if specs and not getattr(env, "raw_text_actions", False):
        names = [spec.get("function", spec).get("name") for spec in specs]
        raise InvalidArgumentError(
            f"credit_assignment='per_turn' is rejected for native tool-calling environments "
            f"({type(env).__name__} offers tools {names}): use 'per_episode'."
        )
