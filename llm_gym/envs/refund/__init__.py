"""Refund-v0: customer service on a stateful store API, in document 002's stateless style.

``RefundEnv`` is an :class:`~llm_gym.environments.EnvironmentMultiTurn`;
``gym.make("Refund-v0")`` wraps it in a :class:`~llm_gym.gym.TextEnv` through
:class:`~llm_gym.environments.MultiTurnEnvAdapter`.
"""

from llm_gym.envs.refund.api import TOOL_SPECS, apply_action, replay_actions
from llm_gym.envs.refund.env import (
    MAX_EPISODE_TURNS,
    SYSTEM_PROMPT,
    VERSION,
    RefundEnv,
    load_environment,
    oracle_action,
)
from llm_gym.envs.refund.protocol import parse_action, render_tool_call, render_tool_results
from llm_gym.envs.refund.reward import WEIGHTS, Behaviours, judge, score_transcript
from llm_gym.envs.refund.state import Fault, StoreState
from llm_gym.envs.refund.tasks import generate_tasks, get_tasks
from llm_gym.envs.refund.world import POLICY, World

__all__ = [
    # the environment
    "RefundEnv",
    "VERSION",
    "load_environment",
    "get_tasks",
    "generate_tasks",
    "oracle_action",
    # the store and its protocol
    "POLICY",
    "SYSTEM_PROMPT",
    "MAX_EPISODE_TURNS",
    "TOOL_SPECS",
    "World",
    "StoreState",
    "Fault",
    "apply_action",
    "replay_actions",
    "parse_action",
    "render_tool_call",
    "render_tool_results",
    # the reward
    "WEIGHTS",
    "Behaviours",
    "judge",
    "score_transcript",
]
