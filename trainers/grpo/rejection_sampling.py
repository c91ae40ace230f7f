"""Rejection-sampling fine-tuning (RFT) in the GRPO trainer: ``credit_assignment:
rejection_sampling``.

RFT fine-tunes a model on its own successful episodes: sample, keep the episodes that succeed,
train on them with the SFT loss, repeat (RAFT, ReST, STaR's online form). In the trainer it is an
advantage estimator: every token of an episode that succeeded gets advantage 1, every other
token 0. On-policy (the importance ratio is 1) the policy-gradient loss with these advantages
has the gradient of the negative log-likelihood of the successful episodes' sampled tokens, that
is the SFT loss on them; failed episodes contribute nothing and there is no baseline.

Success is the environment's judgement (:func:`llm_gym.eval.metrics.episode_succeeded`: its
``metrics["success"]`` flag, else its reward against :data:`SUCCESS_REWARD`), the test
evaluation counts; the reward that enters GRPO's advantage (shaped, plus the user's reward
functions) does not decide it.

RFT and GRPO draw from one sampling budget. Both collect the same tasks in groups of
``episodes_per_task`` and run the same dynamic sampling: a group without a learning signal is
set aside as a spare and refilled, for at most ``max_sampling_attempts`` collection rounds
(seeded refills, :func:`trainers.grpo.dynamic_sampling.refill_tasks`), or ``max_sampling_attempts``
x the batch's groups in async runs. Only the test of a signal differs (:func:`group_signal`): GRPO
sets aside a group whose shaped rewards are all equal, RFT a group in which no episode succeeded (it
has no episode to imitate; one that succeeded every time is RFT's strongest signal). So on a run
where the two tests agree on every group collected, RFT and GRPO draw exactly the same groups
and episodes, and neither draws more than the budget on any run. Everything else (the batch, the
optimizer, the loss normalisation) is GRPO's: the baseline that shows what the group-relative
signal adds beyond learning from one's own successes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.metrics import episode_succeeded
from trainers.grpo.advantages import Advantages, ScaleRewards, register_advantage_estimator
from trainers.grpo.dynamic_sampling import GroupSignal, varied_rewards

__all__ = [
    "SUCCESS_REWARD",
    "success_values",
    "any_success",
    "group_signal",
    "credit_rewards",
    "rejection_sampling_credit",
]

SUCCESS_REWARD = 1.0
"""The environment's reward at which an episode succeeded, when the environment reports no
``metrics["success"]`` flag: the built-in environments give 1.0 for a solved task."""


def success_values(groups: Sequence[Sequence[Any]]) -> list[list[float]]:
    """1.0 for every episode that succeeded by its environment's judgement
    (:func:`~llm_gym.eval.metrics.episode_succeeded` at :data:`SUCCESS_REWARD`), else 0.0.

    Example:
        >>> from types import SimpleNamespace as E
        >>> success_values([[E(reward=1.0, metrics={}), E(reward=0.0, metrics={"success": True})]])
        [[1.0, 1.0]]
    """
    return [
        [1.0 if episode_succeeded(e.reward, e.metrics, SUCCESS_REWARD) else 0.0 for e in group]
        for group in groups
    ]


def any_success(group: Sequence[Any], rewards_G: Sequence[float]) -> bool:
    """RFT's signal: at least one episode of the group succeeded (``rewards_G``, the shaped
    rewards, is not read)."""
    return any(success_values([group])[0])


def _every_group(group: Sequence[Any], rewards_G: Sequence[float]) -> bool:
    return True


def group_signal(args: Any) -> GroupSignal:
    """Dynamic sampling's test of a group's signal for the config ``args``: every group under
    on-policy distillation (its signal is per token), :func:`any_success` under RFT,
    :func:`~trainers.grpo.advantages.varied_rewards` (GRPO's) otherwise."""
    if args.distillation is not None:
        return _every_group
    if args.credit_assignment == "rejection_sampling":
        return any_success
    return varied_rewards


def credit_rewards(
    args: Any, groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]
) -> list[list[float]]:
    """What the config's advantage estimator reads: each episode's success
    (:func:`success_values`) under RFT, the shaped rewards ``rewards`` otherwise."""
    if args.credit_assignment == "rejection_sampling":
        return success_values(groups)
    return [list(group) for group in rewards]


def rejection_sampling_credit(
    rewards: Sequence[Sequence[float]],
    turn_rewards: Sequence[Sequence[Sequence[float] | None]],
    scale_rewards: ScaleRewards = "none",
) -> Advantages:
    """Advantage 1 for every episode that succeeded, 0 for the others. ``rewards[g][e]`` is the
    episode's success, 1.0 or 0.0 (:func:`success_values`: the trainer passes these, not the
    shaped rewards, to this estimator); ``scale_rewards`` and per-turn rewards do not apply (RFT
    imitates whole successful episodes).

    Example:
        >>> credit = rejection_sampling_credit([[1.0, 0.0, 0.0], [1.0, 1.0]], [[None] * 3] * 2)
        >>> credit.episode
        [[1.0, 0.0, 0.0], [1.0, 1.0]]
    """
    for g, group in enumerate(rewards):
        for e, value in enumerate(group):
            if value not in (0.0, 1.0):
                raise InvalidArgumentError(
                    f"rejection_sampling reads each episode's success, 1.0 or 0.0; rewards[{g}]"
                    f"[{e}] is {value!r}. Pass trainers.grpo.rejection_sampling.success_values("
                    "groups), not shaped rewards."
                )
    episode = [[float(value) for value in group] for group in rewards]
    return Advantages(episode, [[None] * len(group) for group in rewards])


register_advantage_estimator("rejection_sampling", rejection_sampling_credit)
