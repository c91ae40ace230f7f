"""Judged rewards: an OpenAI-compatible judge endpoint scores episodes against a rubric.

* :mod:`llm_gym.judge.rubric`: weighted criteria (yes/no or 0-10), the score, the parse rules of
  the judge's reply;
* :mod:`llm_gym.judge.prompt`: what the judge is asked, per episode or per group;
* :mod:`llm_gym.judge.judge`: the endpoint client (timeouts, retries, cache, failure counts);
* :mod:`llm_gym.judge.reward`: :class:`JudgeReward`, a TRL-style reward function.

The guide is ``docs/guides/judged_rewards.md``.
"""

from llm_gym.judge.judge import (
    JUDGE_MODES,
    Judge,
    Judgement,
    JudgeSettings,
    JudgeStats,
    shared_judge,
)
from llm_gym.judge.prompt import EPISODE_SYSTEM, GROUP_SYSTEM, render_messages
from llm_gym.judge.reward import JudgeReward
from llm_gym.judge.rubric import (
    Criterion,
    JudgeReplyError,
    Rubric,
    parse_group_verdicts,
    parse_verdict,
)

__all__ = [
    # the rubric and its parse rules
    "Criterion",
    "Rubric",
    "JudgeReplyError",
    "parse_verdict",
    "parse_group_verdicts",
    # the prompt
    "EPISODE_SYSTEM",
    "GROUP_SYSTEM",
    "render_messages",
    # the judge
    "JUDGE_MODES",
    "Judge",
    "JudgeSettings",
    "JudgeStats",
    "Judgement",
    "shared_judge",
    "JudgeReward",
]
