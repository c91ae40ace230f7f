"""What the episode loop writes into an :class:`~llm_gym.rollout.episode.Episode`: its turns
(:func:`turn_record`, :func:`unsent_turn`), its token counts and token stream (:func:`take_tokens`),
its group's scoring (:func:`score_group`, document 002's ``score_episodes``, once every episode of
the group has ended) and its per-turn rewards (:func:`take_per_turn_rewards`).
"""

from __future__ import annotations

import math
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from llm_gym.core.env import Env, TruncationCause, step_outcome
from llm_gym.core.text import clean_json, clean_text
from llm_gym.core.types import Message
from llm_gym.errors import ChatTemplateError, InvalidArgumentError, TokenizerError
from llm_gym.policies.base import Generation
from llm_gym.rollout.driver import EpisodeDriver
from llm_gym.rollout.episode import Episode, Turn
from llm_gym.rollout.tokens import TokenTracker

__all__ = [
    "MAX_TOKEN_COUNT",
    "count_tokens",
    "every_episode_failed",
    "score_group",
    "take_per_turn_rewards",
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


def take_per_turn_rewards(episode: Episode) -> None:
    """Move the ``per_turn_rewards`` an environment reports in its metrics (one finite number
    per assistant turn) onto the episode's turns (:attr:`Turn.reward`); a list of the wrong
    length or with a value that is not a finite number is left out with a warning and the
    metric ``per_turn_rewards_invalid``, and the episode uses episode-level credit."""
    if "per_turn_rewards" not in episode.metrics:
        return
    episode.metrics = metrics = dict(episode.metrics)
    rewards = metrics.pop("per_turn_rewards")
    if rewards is None:
        return
    turns = episode.turns
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


async def score_group(ended: Sequence[tuple[Episode, Env | None]]) -> None:
    """Score the group's deferred episodes together (one ``score_episodes`` call per shared
    environment), each given with its env (None when its factory failed); a failure ends only
    the episodes it concerns, as ``ENV`` with the error."""
    by_environment: dict[int, list[tuple[Episode, Env]]] = {}
    for episode, env in ended:
        if env is not None and env.scoring_pending:
            by_environment.setdefault(id(env.scoring_key), []).append((episode, env))
    for members in by_environment.values():
        envs = [env for _, env in members]
        try:
            results = await envs[0].score_group(envs)
        except Exception as exc:
            results = [exc] * len(members)
        for (episode, env), result in zip(members, results, strict=True):
            if not isinstance(result, BaseException):
                try:  # a NaN reward, say: that episode's failure
                    reward, metrics = step_outcome(result, f"{type(env).__name__}.score")
                except InvalidArgumentError as exc:
                    result = exc
            if isinstance(result, BaseException):
                error = clean_text("".join(traceback.format_exception(result)))
                episode.end(0.0, TruncationCause.ENV, error=error)
            else:
                episode.reward, episode.metrics = reward, clean_json(metrics)


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
    driver: EpisodeDriver, generation: Generation, episode: Episode, tracker: TokenTracker | None
) -> Message:
    """Record a reply the full context cut short, which the environment never gets: its
    :class:`Turn` (parsed for the record, no environment messages), its tokens in the episode's
    counts and token stream (so it is trained on, with the context's ending). Returns its
    message, for the episode's transcript."""
    parsed = driver.parser.parse(generation.text, call_id_prefix=f"call_t{episode.num_turns + 1}")
    episode.turns.append(
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
    take_tokens(episode, generation, tracker)
    return parsed.message


def take_tokens(episode: Episode, generation: Generation, tracker: TokenTracker | None) -> None:
    """Count the last turn's ``generation`` in ``episode`` and append it to the token stream."""
    count_tokens(episode, generation, first=episode.num_turns == 1)
    if tracker is not None and generation.token_ids is not None:
        tracker.add_generation(
            generation.token_ids,
            generation.logprobs,
            generation.text,
            episode.num_turns - 1,
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
