"""How a collection of episodes runs (:class:`RolloutSettings`, one record the trainer, the
evaluator and :func:`~llm_gym.rollout.collect_groups` share) and what it hands back
(:class:`EpisodeGroups` with its :class:`RolloutStats`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.env import require_turn_limit
from llm_gym.errors import InvalidArgumentError, did_you_mean
from llm_gym.policies.template_tools import check_template_tools
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD

__all__ = ["EpisodeGroups", "RolloutSettings", "RolloutStats", "rollout_settings"]


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are run (one object, so the trainer and the evaluator share it)."""

    max_turns: int
    """Assistant turns per episode before ``MAX_TURNS`` truncation."""
    max_model_length: int | None = None
    """Context budget in tokens, prompt and every turn (checked when the policy has a
    tokenizer). A turn generates at most what still fits (``max_new_tokens`` or fewer, at least
    one token); ``CONTEXT_OVERFLOW`` when the conversation fills it before the episode ends: no
    token left for the next turn, or a turn cut short by the context rather than by
    ``max_new_tokens`` (that reply never reaches the environment; its tokens are kept)."""
    max_new_tokens: int | None = None
    """Generation budget of one assistant turn (``None``: the policy's default)."""
    failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD
    """Reward of an episode that ends on an unparseable action."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra arguments for the chat template (``enable_thinking``, ...)."""
    template_tools: str = "fallback"
    """A chat template that cannot render tools: ``"fallback"`` writes them as text into the
    system message (:mod:`llm_gym.policies.template_tools`), ``"require"`` refuses it."""
    generation_deadline_s: tuple[float, float] | None = None
    """``(shortest, longest)`` seconds a policy may take for one turn, growing with the
    context (:func:`generation_deadline`); a missed deadline aborts the turn and retries it once,
    a second miss ends the episode as ``DEADLINE``. None: no deadline."""
    env_timeout_s: float | None = None
    """Seconds an environment's async ``reset``/``step``/``close`` may take before it is
    cancelled and its episode ends as ``ENV`` (the episode driver's ``env_timeout_s``).
    None: no limit (document 002: deadlines do not cover environment calls)."""
    action_format: str | ActionFormat = "auto"
    """How tool calls are written and parsed: ``"auto"`` (the format the chat template teaches,
    else hermes: :func:`~llm_gym.policies.template_format.episode_format`) or a registered
    name or :class:`~llm_gym.actions.ActionFormat` (pinned; a warning when the template
    differs)."""

    def __post_init__(self) -> None:
        require_turn_limit(self.max_turns)
        check_template_tools(self.template_tools)
        if self.max_model_length is not None and self.max_model_length < 1:
            raise InvalidArgumentError(
                f"max_model_length must be None or >= 1, actual value: {self.max_model_length!r}."
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise InvalidArgumentError(
                f"max_new_tokens must be None or >= 1, actual value: {self.max_new_tokens!r}."
            )


@dataclass
class RolloutStats:
    """How a collection went (for tests, benchmarks and logs)."""

    policy_calls: int
    """Batched ``policy.act`` calls (one per wave), or a streaming policy's batched model calls
    (one forward pass per step of continuous batching)."""
    batch_sizes: list[int]
    """Episodes served by each call."""
    wall_time_s: float
    """Seconds for the whole collection."""


class EpisodeGroups(list):  # type: ignore[type-arg]
    """``groups[i][j]``: episode ``j`` of ``tasks[i]`` (a list of lists), and :attr:`stats`."""

    stats: RolloutStats
    """How the collection went."""


_SETTING_NAMES = frozenset(RolloutSettings.__dataclass_fields__)


def rollout_settings(settings: RolloutSettings | None, fields: dict[str, Any]) -> RolloutSettings:
    """``settings`` with ``fields`` (:class:`RolloutSettings` fields by keyword) set over it;
    without ``settings``, the record of ``fields`` (``max_turns`` is needed).

    Raises:
        InvalidArgumentError: A name that is not a field (the message lists the fields), or no
            ``max_turns`` at all.
    """
    unknown = sorted(set(fields) - _SETTING_NAMES)
    if unknown:
        hint = did_you_mean(unknown[0], _SETTING_NAMES)
        raise InvalidArgumentError(
            f"Unknown rollout setting(s) {unknown}: collect_groups takes RolloutSettings' "
            f"fields by keyword: {sorted(_SETTING_NAMES)}.{hint}"
        )
    if settings is None:
        if "max_turns" not in fields:
            raise InvalidArgumentError(
                "collect_groups needs max_turns (the turn limit): pass settings=RolloutSettings("
                "max_turns=...) or max_turns=..."
            )
        return RolloutSettings(**fields)
    return dataclasses.replace(settings, **fields) if fields else settings
