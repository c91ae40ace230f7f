"""Rejection-sampling fine-tuning (RFT) in the GRPO trainer: ``credit_assignment:
rejection_sampling``.

RFT fine-tunes a model on its own successful episodes: sample, keep the episodes that succeed,
train on them with the SFT loss, repeat (RAFT, ReST, STaR's online form). In the trainer it is an
advantage estimator: every token of an episode whose reward reaches :data:`SUCCESS_REWARD` gets
advantage 1, every other token 0. On-policy (the importance ratio is 1) the policy-gradient loss
with these advantages has the gradient of the negative log-likelihood of the successful
episodes' sampled tokens, that is the SFT loss on them; failed episodes contribute nothing and
there is no baseline. Everything else (the rollouts, their cost, the batch, the optimizer, the
loss normalisation) is GRPO's, so RFT and GRPO run at the same compute per step: the baseline
that shows what the group-relative signal adds beyond learning from one's own successes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainers.advantages import Advantages, ScaleRewards, register_advantage_estimator

__all__ = ["SUCCESS_REWARD", "keeps_uniform_groups", "rejection_sampling_credit"]

SUCCESS_REWARD = 1.0
"""An episode whose shaped reward is at least this succeeded: the built-in envs give 1.0 for a
solved task, and the shaping's penalties (a failed parse, the overlong penalty of a truncated
episode) fall only on episodes that did not solve it."""


def keeps_uniform_groups(args: Any) -> bool:
    """Whether a group whose episodes all got the same reward still trains: under RFT a group
    that succeeded every time is its strongest signal (and under on-policy distillation every
    group carries a per-token one), so dynamic sampling must not set it aside."""
    return args.distillation is not None or args.credit_assignment == "rejection_sampling"


def rejection_sampling_credit(
    rewards: Sequence[Sequence[float]],
    turn_rewards: Sequence[Sequence[Sequence[float] | None]],
    scale_rewards: ScaleRewards = "none",
) -> Advantages:
    """Advantage 1 for every episode that succeeded, 0 for the others (``scale_rewards`` and
    per-turn rewards do not apply: RFT imitates whole successful episodes).

    Example:
        >>> credit = rejection_sampling_credit([[1.0, 0.0, -0.1], [1.0, 1.0]], [[None] * 3] * 2)
        >>> credit.episode
        [[1.0, 0.0, 0.0], [1.0, 1.0]]
    """
    episode = [[1.0 if r >= SUCCESS_REWARD else 0.0 for r in group] for group in rewards]
    return Advantages(episode, [[None] * len(group) for group in rewards])


register_advantage_estimator("rejection_sampling", rejection_sampling_credit)
