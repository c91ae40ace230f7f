"""Rollouts: the episode driver, the loop that runs groups of episodes, and token samples.

Policies (what writes the assistant's turns) live in :mod:`llm_gym.policies`.
"""

from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD, EpisodeDriver
from llm_gym.rollout.episode import Episode, Turn
from llm_gym.rollout.loop import collect_groups, collect_groups_async
from llm_gym.rollout.settings import EpisodeGroups, RolloutSettings, RolloutStats
from llm_gym.rollout.tokens import TokenSample, TokenTracker, episode_to_samples

__all__ = [
    # the driver: every rule of an episode
    "EpisodeDriver",
    "DEFAULT_FAILED_PARSE_REWARD",
    # the loop
    "collect_groups",
    "collect_groups_async",
    "RolloutSettings",
    "RolloutStats",
    "EpisodeGroups",
    # records: an episode (its turns, its ending, its token samples)
    "Episode",
    "Turn",
    "TokenSample",
    # tokens
    "TokenTracker",
    "episode_to_samples",
]
