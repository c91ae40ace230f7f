"""The records of the episode loop: a turn's record, an ended episode, its group's scoring.

The loop (:mod:`llm_gym.rollout.loop`) runs an episode to its end (:class:`Ended`), scores the
group's deferred episodes together once all have ended (:func:`score_group`, document 002's
``score_episodes``), then writes each :class:`~llm_gym.rollout.episode.Episode` record
(:func:`finalize`).
"""

from __future__ import annotations

import math
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.core.env import Env, TruncationCause, step_outcome
from llm_gym.core.text import clean_json, clean_text
from llm_gym.core.types import Message
from llm_gym.errors import ChatTemplateError, InvalidArgumentError, TokenizerError
from llm_gym.policies.base import Generation, PolicyError
from llm_gym.rollout.driver import EpisodeDriver, EpisodeEnd
from llm_gym.rollout.episode import Episode, Turn
from llm_gym.rollout.tokens import TokenTracker

__all__ = [
    "MAX_TOKEN_COUNT",
    "Ended",
    "count_tokens",
    "every_episode_failed",
    "finalize",
    "score_group",
    "take_tokens",
    "turn_record",
    "unsent_turn",
    "usage_count",
]


def _count_tool_errors(messages: Sequence[Message]) -> int:
    return sum(
        1
        for m in messages
        if m.get("role") == "tool" and str(m.get("content", "")).startswith("tool_error")
    )


def _is_finite_number(value: Any) -> bool:
    """Whether ``value`` is an int or float that a float holds finitely (an int past float's
    range, such as a remote env's ``10**400``, is not)."""
    try:
        return isinstance(value, int | float) and math.isfinite(value)
    except OverflowError:
        return False


def _assign_per_turn_rewards(turns: list[Turn], metrics: dict[str, Any]) -> None:
    rewards = metrics.pop("per_turn_rewards", None)
    if rewards is None:
        return
    valid = (
        isinstance(rewards, list | tuple)
        and len(rewards) == len(turns)
        and all(_is_finite_number(r) for r in rewards)
    )
    if not valid:
        warnings.warn(
            f"Ignoring per_turn_rewards: expected {len(turns)} finite numbers (one per assistant "
            f"turn), got {rewards!r:.120}. The episode uses episode-level credit.",
            stacklevel=2,
        )
        metrics["per_turn_rewards_invalid"] = 1
        return
    for turn, reward in zip(turns, rewards, strict=True):
        turn.reward = float(reward)


@dataclass
class Ended:
    """An episode that has ended, before its reward is final (its group may score it)."""

    episode: Episode
    ending: EpisodeEnd
    tracker: TokenTracker | None
    env: Env | None
    """The episode's env (None when its factory failed)."""
    start: float
    failure: PolicyError | ChatTemplateError | TokenizerError | None = None
    """The error that ended the episode outside the environment: the policy's
    (``POLICY_ERROR``), the chat template's (``TEMPLATE``) or the tokenizer's
    (``TOKENIZER``)."""


async def score_group(ended: list[Ended]) -> None:
    """Score the group's deferred episodes together (one ``score_episodes`` call per shared
    environment); a failure ends only the episodes it concerns, as ``ENV`` with the error."""
    pending = [e for e in ended if e.env is not None and e.env.scoring_pending]
    by_environment: dict[int, list[Ended]] = {}
    for item in pending:
        by_environment.setdefault(id(item.env.scoring_key), []).append(item)
    for members in by_environment.values():
        try:
            results = await members[0].env.score_group([m.env for m in members])
        except Exception as exc:
            results = [exc] * len(members)
        for member, result in zip(members, results, strict=True):
            if not isinstance(result, BaseException):
                try:  # a NaN reward, say: that episode's failure
                    reward, metrics = step_outcome(result, f"{type(member.env).__name__}.score")
                except InvalidArgumentError as exc:
                    result = exc
            if isinstance(result, BaseException):
                error = clean_text("".join(traceback.format_exception(result)))
                member.ending = EpisodeEnd(0.0, False, TruncationCause.ENV, error=error)
            else:
                member.ending.reward, member.ending.metrics = reward, clean_json(metrics)


def finalize(ended: Ended) -> Episode:
    """The episode record, once its reward is final."""
    episode, ending, tracker = ended.episode, ended.ending, ended.tracker
    episode.reward = ending.reward
    episode.terminated, episode.truncated = ending.terminated, ending.truncated
    episode.truncation_cause = ending.truncation_cause
    episode.metrics = dict(ending.metrics)
    if ending.error is not None:
        episode.error = ending.error + (episode.error or "")
    _assign_per_turn_rewards(episode.turns, episode.metrics)
    if tracker is not None:
        episode.samples = tracker.finish(episode.reward, episode.per_turn_rewards)
    episode.wall_time_s = time.perf_counter() - ended.start
    return episode


def turn_record(driver: EpisodeDriver, generation: Generation) -> Turn:
    """The :class:`Turn` of the act the driver just took."""
    parsed = driver.parsed
    env_messages = driver.replies()
    return Turn(
        text=generation.text,
        parse_kind=parsed.kind,  # type: ignore[union-attr]  (record_parse is on)
        message=driver.action,  # type: ignore[arg-type]
        parse_error=parsed.error,  # type: ignore[union-attr]
        env_messages=env_messages,
        tool_calls=len(parsed.tool_calls),  # type: ignore[union-attr]
        tool_errors=_count_tool_errors(env_messages),
        token_ids=generation.token_ids,
        logprobs=generation.logprobs,
        finish_reason=generation.finish_reason,
        policy_versions=generation.policy_versions,
    )


def unsent_turn(
    driver: EpisodeDriver,
    generation: Generation,
    turns: list[Turn],
    episode: Episode,
    tracker: TokenTracker | None,
) -> Message:
    """Record a reply the full context cut short, which the environment never gets: its
    :class:`Turn` (parsed for the record, no environment messages), its tokens in the episode's
    counts and token stream (so it is trained on, with the context's ending). Returns its
    message, for the episode's transcript."""
    parsed = driver.parser.parse(generation.text, call_id_prefix=f"call_t{len(turns) + 1}")
    turns.append(
        Turn(
            text=generation.text,
            parse_kind=parsed.kind,
            message=parsed.message,
            parse_error=parsed.error,
            tool_calls=len(parsed.tool_calls),
            token_ids=generation.token_ids,
            logprobs=generation.logprobs,
            finish_reason=generation.finish_reason,
            policy_versions=generation.policy_versions,
        )
    )
    take_tokens(episode, generation, turns, tracker)
    return parsed.message


def take_tokens(
    episode: Episode, generation: Generation, turns: list[Turn], tracker: TokenTracker | None
) -> None:
    """Count the last turn's ``generation`` in ``episode`` and append it to the token stream."""
    count_tokens(episode, generation, first=len(turns) == 1)
    if tracker is not None and generation.token_ids is not None:
        tracker.add_generation(
            generation.token_ids,
            generation.logprobs,
            generation.text,
            len(turns) - 1,
            generation.policy_versions,
        )


MAX_TOKEN_COUNT = 2**53
"""The largest token count an episode records (a float holds every integer up to it): a usage
count an endpoint reports past it is clamped to it, so sums and means of counts stay finite
floats and the report is written."""


def usage_count(value: object) -> int:
    """A token count an endpoint reported, as the episode records it: a non-negative integer of
    at most :data:`MAX_TOKEN_COUNT` (a larger one, or infinity, clamped with a warning; a
    fraction rounded down); anything else (negative, NaN, text, null) counts 0.

    Example:
        >>> usage_count(12), usage_count(7.0), usage_count(None), usage_count(-3), usage_count("7")
        (12, 7, 0, 0, 0)
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return 0
    if value > MAX_TOKEN_COUNT:
        warnings.warn(
            f"the policy reported a token count past {MAX_TOKEN_COUNT:,} "
            "(llm_gym.rollout.records.MAX_TOKEN_COUNT); it is counted as that",
            RuntimeWarning,
            stacklevel=2,
        )
        return MAX_TOKEN_COUNT
    return int(value)


def count_tokens(episode: Episode, generation: Generation, *, first: bool) -> None:
    """Add the tokens ``generation`` sampled to ``episode`` (the policy's token ids, else the
    endpoint's usage report, :func:`usage_count`); the first turn's report sets the prompt's."""
    if generation.token_ids is not None:
        sampled = len(generation.token_ids)
    else:  # an HTTP endpoint reports its own counts
        usage = generation.metadata.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        sampled = usage_count(usage.get("completion_tokens"))
        if first:
            episode.prompt_tokens = usage_count(usage.get("prompt_tokens"))
    episode.completion_tokens = min(episode.completion_tokens + sampled, MAX_TOKEN_COUNT)


def every_episode_failed(
    failures: list[ChatTemplateError | TokenizerError], total: int
) -> ChatTemplateError | TokenizerError:
    """The error of a collection whose every episode the model's chat template or tokenizer
    ended: no episode ran, so no score would mean anything."""
    first = failures[0]
    what = "chat template" if isinstance(first, ChatTemplateError) else "tokenizer"
    error = type(first)(
        f"the model's {what} failed every one of the {total} episodes of this collection; the "
        f"first error: {first} (give the model a template that renders these "
        "conversations: the chat_template option, --chat-template)"
    )
    error.__cause__ = first
    return error
