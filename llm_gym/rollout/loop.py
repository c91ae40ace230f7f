"""The episode loop: groups of whole episodes, run concurrently, batched across groups.

Every episode runs as its own coroutine on an :class:`~llm_gym.rollout.driver.EpisodeDriver`,
which owns the rules of an episode; this module adds the policy, the token samples and the
records. With a policy that opens a :class:`~llm_gym.policies.PolicyStream` (``HFPolicy``),
each turn goes to the stream as soon as the episode needs it, and the policy batches
continuously across all groups: an episode whose turn ended steps its environment and rejoins
the running batch without waiting for the others. With any other policy an episode joins the
current *wave*; a wave is sent to the policy as one batched ``act`` call as soon as every live
episode is waiting (none is inside an environment step), so a model generates for all groups at
once while environment steps overlap with each other on the event loop.

One episode's failure never loses the others: an environment that raises (or outlasts
``env_timeout_s``) ends its own episode as ``ENV``; a policy that fails an episode's turn ends
that episode as ``POLICY_ERROR`` (:mod:`llm_gym.rollout.batching` finds which requests failed).
The collection raises the :class:`~llm_gym.policies.PolicyError` only when it is ``fatal``, when
every episode ended that way, or when the policy answered no turn at all: a policy that is down
fails the collection at once.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Hashable, Sequence
from typing import Any

from llm_gym.aio import run_sync
from llm_gym.core.env import Env, TruncationCause
from llm_gym.core.factories import EnvFactory, Oracle, as_env_factory
from llm_gym.core.task import Task
from llm_gym.core.text import clean_text
from llm_gym.core.types import Message
from llm_gym.errors import ChatTemplateError, InvalidArgumentError, TokenizerError
from llm_gym.policies.base import Generation, Policy, PolicyError, PolicyRequest, PolicyStream
from llm_gym.policies.template_format import episode_format
from llm_gym.rollout.batching import Streamed, Waves
from llm_gym.rollout.driver import EpisodeDriver
from llm_gym.rollout.episode import Episode
from llm_gym.rollout.records import (
    every_episode_failed,
    score_group,
    take_per_turn_rewards,
    take_tokens,
    turn_record,
    unsent_turn,
)
from llm_gym.rollout.settings import EpisodeGroups, RolloutSettings, RolloutStats, rollout_settings
from llm_gym.rollout.tokens import TokenTracker

__all__ = [
    "collect_groups",
    "collect_groups_async",
]


def generation_deadline(
    context_tokens: int, max_model_length: int | None, shortest: float, longest: float
) -> float:
    """Seconds one turn may take: ``shortest`` for an empty context, growing linearly to
    ``longest`` at ``max_model_length`` (document 002: 10 to 60 minutes by context size).

    Example:
        >>> generation_deadline(512, 2048, 600.0, 3600.0)
        1350.0
    """
    if not max_model_length:
        return shortest
    share = min(1.0, max(0.0, context_tokens / max_model_length))
    return shortest + (longest - shortest) * share


async def _act_in_time(
    waves: Waves | Streamed, request: PolicyRequest, key: Hashable, deadline: float | None
) -> tuple[Generation | None, Hashable]:
    """The turn's generation, retried once under a new key when it misses ``deadline``; None
    after a second miss. Returns the key the episode goes on with."""
    if deadline is None:
        return await waves.act(request, key), key
    for attempt in range(2):
        try:
            return await asyncio.wait_for(waves.act(request, key), deadline), key
        except TimeoutError:
            waves.abort(key)
            key = (key, "retry", attempt)
    return None, key


async def _run_episode(
    driver: EpisodeDriver,
    task: Task,
    group: int,
    index: int,
    key: Hashable,
    waves: Waves | Streamed,
    settings: RolloutSettings,
    oracle: Oracle | None,
    tokenizer: Any,
) -> tuple[Episode, Env | None, PolicyError | ChatTemplateError | TokenizerError | None]:
    """One episode: the driver keeps the rules and writes the ending into the episode's record;
    this adds the policy, the turns and the tokens. Returns the record with its env (None when
    the factory failed; for the group's scoring) and the error that ended it outside the
    environment: the policy's (``POLICY_ERROR``), the chat template's (``TEMPLATE``) or the
    tokenizer's (``TOKENIZER``)."""
    start = time.perf_counter()
    tracker: TokenTracker | None = None
    limit = None  # the most context tokens a prompt may have: one generated token must fit
    if settings.max_model_length is not None:
        limit = settings.max_model_length - 1
    ending = None
    unsent: Message | None = None  # a reply the full context cut short: recorded, never sent
    env = None
    failure: PolicyError | ChatTemplateError | TokenizerError | None = None
    try:
        messages = await driver.start(task)
        episode = driver.episode
        assert episode is not None
        env = driver.env
        env.defer_scoring()  # an env that scores a whole group (document 002's score_episodes)
        tool_specs = driver.tool_specs
        if tokenizer is not None:
            tracker = TokenTracker(
                tokenizer,
                tool_specs,
                settings.chat_template_kwargs,
                action_format=driver.action_format,
                template_tools=settings.template_tools,
            )
            tracker.start(messages)
            episode.prompt_tokens = tracker.context_length
        while ending is None:
            if (
                tracker is not None
                and limit is not None
                and (tracker.overflow_tokens is not None or tracker.context_length > limit)
            ):
                episode.overflow_tokens = tracker.overflow_tokens or 0
                ending = await driver.cut(TruncationCause.CONTEXT_OVERFLOW)
                break
            budget = settings.max_new_tokens
            if tracker is not None and limit is not None and budget is not None:
                budget = min(budget, limit + 1 - tracker.context_length)  # what still fits
            request = PolicyRequest(
                messages=list(driver.messages),
                tool_specs=tool_specs,
                task=task,
                action_format=driver.action_format,
                max_new_tokens=budget,
                prompt_ids=tracker.context_ids if tracker is not None else None,
                oracle=oracle,
                tool_choice=env.tool_choice,
            )
            deadline = None
            if settings.generation_deadline_s is not None:
                deadline = generation_deadline(
                    len(request.prompt_ids or ()),
                    settings.max_model_length,
                    *settings.generation_deadline_s,
                )
            generation, key = await _act_in_time(waves, request, key, deadline)
            if generation is None:  # missed twice: the env never sees a timed-out output
                ending = await driver.cut(TruncationCause.DEADLINE)
                break
            generation.text = clean_text(generation.text)  # records, tokens and env agree
            if generation.finish_reason == "length" and budget != settings.max_new_tokens:
                # The context, not max_new_tokens, cut this reply: the conversation filled
                # max_model_length before the episode ended.
                unsent = unsent_turn(driver, generation, episode, tracker)
                ending = await driver.cut(TruncationCause.CONTEXT_OVERFLOW)
                break
            if tracker is not None:  # document 002's total_tokens
                env.note_tokens(tracker.context_length + len(generation.token_ids or ()))
            ending = await driver.act(generation.text)
            turn = turn_record(driver, generation)
            episode.turns.append(turn)
            take_tokens(episode, generation, tracker)
            # The reply joins the token stream while the episode goes on, and when the turn cap
            # ended it (a reply the policy would have read next), not when the env ended it.
            capped = ending is None or ending.truncation_cause is TruncationCause.MAX_TURNS
            if tracker is not None and turn.env_messages and capped:
                tracker.add_environment(turn.env_messages, limit)
    except asyncio.CancelledError:
        raise
    except PolicyError as exc:
        if exc.fatal:
            raise
        failure = exc  # this episode's turn failed in the policy: the others go on
        error = "".join(traceback.format_exception(exc))
        await driver.cut(TruncationCause.POLICY_ERROR, error)
    except ChatTemplateError as exc:  # the model's template, not the environment
        failure = exc
        driver.end(TruncationCause.TEMPLATE, error=traceback.format_exc())
    except TokenizerError as exc:
        failure = exc
        driver.end(TruncationCause.TOKENIZER, error=traceback.format_exc())
    except Exception:
        driver.end(TruncationCause.ENV, error=traceback.format_exc())
    finally:
        episode = driver.episode  # start makes it before anything can fail
        assert episode is not None
        episode.messages = list(driver.messages)  # before close: the env may own that list
        if unsent is not None:
            episode.messages.append(unsent)
        try:
            await driver.close()
        except Exception:
            episode.error = (episode.error or "") + clean_text(traceback.format_exc())
        waves.episode_done(key)
    episode.group, episode.index = group, index
    if tracker is not None:
        episode.samples = tracker.finish()
    episode.wall_time_s = time.perf_counter() - start
    return episode, env, failure


async def collect_groups_async(
    env_factory: EnvFactory | Any,
    tasks: Sequence[Task],
    policy: Policy,
    settings: RolloutSettings | None = None,
    *,
    episodes_per_task: int = 1,
    oracle: Oracle | None = None,
    tokenizer: Any = None,
    progress: bool | str = False,
    stream: PolicyStream | None = None,
    key_space: Hashable = None,
    **fields: Any,
) -> EpisodeGroups:
    """Run ``episodes_per_task`` episodes of every task, all concurrently; one group per task.

    Args:
        env_factory: Builds a fresh environment for each episode (``task -> Env``); an ``Env``
            class or a ``"module:attr"`` string works too.
        tasks: The tasks; every episode of a group starts from the same task.
        policy: Produces the actions: through its stream when it opens one (continuous
            batching), else one batched call per wave of waiting episodes.
        settings: How the episodes run (:class:`RolloutSettings`: the turn limit, the context
            and token budgets, the action format, deadlines, ...).
        episodes_per_task: Episodes per task (the group size).
        oracle: The environment's scripted expert, for ``OraclePolicy``.
        tokenizer: Builds token samples (token-in/token-out); defaults to ``policy.tokenizer``
            (the context budget needs one).
        progress: Show a progress bar (a string sets its description).
        stream: A stream of ``policy`` that outlives this collection (async training's rollout
            worker runs many collections on one engine); it is left open. None: the policy
            opens one for this collection, when it streams.
        key_space: Tells this collection's episodes apart from others on a shared ``stream``
            (episode keys become ``(key_space, group, index)``).
        **fields: :class:`RolloutSettings` fields by keyword (``max_turns=6``), set over
            ``settings`` (or making the whole record without it).

    Raises:
        PolicyError: The policy failed every episode, or answered no turn and failed some, or
            failed with a ``fatal`` error.
        ChatTemplateError: The chat template failed every episode (``TEMPLATE``).
        TokenizerError: The tokenizer failed every episode (``TOKENIZER``; the first failure's
            kind names the error when both failed).

    Returns:
        ``groups[i][j]``: episode ``j`` of ``tasks[i]``, with the collection's
        :attr:`~EpisodeGroups.stats`.
    """
    if not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise InvalidArgumentError(
            f"episodes_per_task must be an int >= 1, actual value: {episodes_per_task!r}."
        )
    settings = rollout_settings(settings, fields)
    factory = as_env_factory(env_factory)
    if tokenizer is None:
        tokenizer = getattr(policy, "tokenizer", None)
    fmt = episode_format(settings.action_format, tokenizer, template_tools=settings.template_tools,
                         chat_template_kwargs=settings.chat_template_kwargs)  # fmt: skip
    task_list = list(tasks)
    total = len(task_list) * episodes_per_task
    own_stream = stream is None
    if own_stream:
        open_stream = getattr(policy, "open_stream", None)
        stream = open_stream() if open_stream is not None else None
    waves: Waves | Streamed = (
        Streamed(policy, stream) if stream is not None else Waves(policy, total)
    )
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total,
            desc=progress if isinstance(progress, str) else "episodes",
            unit="ep",
            leave=False,
        )

    failures: list[PolicyError] = []  # the episodes the policy failed
    model_failures: list[ChatTemplateError | TokenizerError] = []  # its template, tokenizer
    answered = 0  # turns the policy answered

    async def one(group: int, index: int, task: Task) -> tuple[Episode, Env | None]:
        driver = EpisodeDriver(
            factory,
            action_format=fmt,
            max_turns=settings.max_turns,
            failed_parse_reward=settings.failed_parse_reward,
            record_parse=True,
            env_timeout_s=settings.env_timeout_s,
        )
        key = (group, index) if key_space is None else (key_space, group, index)
        episode, env, failure = await _run_episode(
            driver, task, group, index, key, waves, settings, oracle, tokenizer
        )
        if bar is not None:
            bar.update(1)
        nonlocal answered
        answered += episode.num_turns
        if isinstance(failure, PolicyError):
            failures.append(failure)
        elif failure is not None:
            model_failures.append(failure)
        return episode, env

    async def whole_group(group: int, task: Task) -> list[Episode]:
        ended = await asyncio.gather(*(one(group, i, task) for i in range(episodes_per_task)))
        await score_group(ended)  # once every episode of the group has ended
        for episode, _ in ended:
            take_per_turn_rewards(episode)
        return [episode for episode, _ in ended]

    start = time.perf_counter()
    try:
        groups = await asyncio.gather(*(whole_group(g, t) for g, t in enumerate(task_list)))
    finally:
        if bar is not None:
            bar.close()
        if stream is not None and own_stream:
            await stream.aclose()
    if failures and (len(failures) == total or not answered):
        raise PolicyError(
            f"The policy failed {len(failures)} of the {total} episodes of this collection and "
            f"answered {answered} turns (it looks down); the first error: {failures[0]}",
            fatal=True,
        ) from failures[0]
    if model_failures and len(model_failures) == total:
        raise every_episode_failed(model_failures, total)
    out = EpisodeGroups(groups)
    out.stats = RolloutStats(waves.calls, waves.batch_sizes, time.perf_counter() - start)
    return out


def collect_groups(*args: Any, **kwargs: Any) -> EpisodeGroups:
    """Synchronous :func:`collect_groups_async` (same arguments)."""
    return run_sync(collect_groups_async(*args, **kwargs))
