"""The fields of :class:`~trainers.grpo.config.multi_turn.MultiTurnGRPOConfig` that train your own
agent (:mod:`trainers.grpo.agent_rollouts`), and their check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentFields", "check_agent_fields"]


@dataclass
class AgentFields:
    """``agent`` and ``agent_timeout_s`` (a base of the trainer's config)."""

    agent: str | None = field(
        default=None,
        metadata={
            "help": "Train your own agent: a 'module:function' reference to "
            "agent(base_url, task) -> reward or final answer, run episodes_per_task times per "
            "task against the policy served as a recording OpenAI-compatible endpoint "
            "(trainers.grpo.agent_rollouts; with max_steps_off_policy, each generator replica "
            "is served on an endpoint of its own; train_multi_turn(agent=...) takes the "
            "callable). Its module must be trusted (train.py --trust-module). None: the "
            "episode loop."
        },
    )
    agent_timeout_s: float | None = field(
        default=600.0,
        metadata={
            "help": "Seconds one agent episode may run before it is cancelled and ends as "
            "DEADLINE (None: no limit)."
        },
    )


def check_agent_fields(config: Any, refuse: Any) -> None:
    """``agent`` (a ``"module:function"`` reference or None, resolved when training starts)
    and ``agent_timeout_s``, and what an agent run excludes (vLLM: the agent talks to the
    trainer's own endpoint, which serves the trainer's model, or in async training each
    generator replica's copy)."""
    agent = config.agent
    if agent is not None and (
        not isinstance(agent, str) or agent.count(":") != 1 or not all(agent.split(":"))
    ):
        refuse("agent", agent, "None or a 'module:function' reference ('my_pkg.agents:play')")
    timeout = config.agent_timeout_s
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        refuse("agent_timeout_s", timeout, "None (no limit) or a finite number of seconds > 0")
    if agent is not None and config.use_vllm:
        refuse(
            "use_vllm",
            True,
            "False with an agent (the trainer's own endpoint serves it: the trainer's model, or "
            "in async training each generator replica's copy)",
        )
