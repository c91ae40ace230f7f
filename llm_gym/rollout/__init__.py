"""The episode loop, policies and token samples."""

from llm_gym.rollout.episode import Episode, Turn
from llm_gym.rollout.hf_policy import HFPolicy
from llm_gym.rollout.loop import (
    DEFAULT_FAILED_PARSE_REWARD,
    PolicyError,
    RolloutSettings,
    RolloutStats,
    collect_groups,
    collect_groups_async,
)
from llm_gym.rollout.openai_policy import OpenAIPolicy
from llm_gym.rollout.policies import Generation, OraclePolicy, Policy, PolicyRequest, RandomPolicy
from llm_gym.rollout.tokens import TokenSample, TokenTracker, episode_to_samples

__all__ = [
    # the loop
    "collect_groups",
    "collect_groups_async",
    "RolloutSettings",
    "RolloutStats",
    "PolicyError",
    "DEFAULT_FAILED_PARSE_REWARD",
    # records
    "Episode",
    "Turn",
    "TokenSample",
    # policies
    "Policy",
    "PolicyRequest",
    "Generation",
    "RandomPolicy",
    "OraclePolicy",
    "OpenAIPolicy",
    "HFPolicy",
    # tokens
    "TokenTracker",
    "episode_to_samples",
]
