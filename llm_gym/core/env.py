"""The environment contract: ``Env``, ``StepResult`` and ``TruncationCause``.

An environment owns the conversation history, tool dispatch and the rule for when an episode
ends. The loop that drives it owns tokenization and sampling.
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llm_gym.core.task import Task
from llm_gym.core.types import FrozenMessage, Message, ToolSpec
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_MAX_TOKENS_PER_TURN",
    "Env",
    "StepResult",
    "SyncEnv",
    "TruncationCause",
    "check_messages",
    "check_step",
    "declared_token_budget",
    "finite_reward",
    "require_turn_limit",
    "step_outcome",
    "step_within_cap",
]


DEFAULT_MAX_TOKENS_PER_TURN = 256
"""Tokens one assistant turn may sample in an environment that declares no budget of its own
(:attr:`Env.max_tokens_per_turn`): room for a few sentences of reasoning and a reply."""


class TruncationCause(enum.StrEnum):
    """Why an episode ended without the environment terminating it.

    Only the two length-budget causes get the soft overlong penalty.
    """

    CONTEXT_OVERFLOW = "context_overflow"
    """The conversation plus the next generation budget would pass ``max_model_length``."""
    MAX_TURNS = "max_turns"
    """The episode ran ``max_turns`` assistant turns without terminating."""
    ENV = "env"
    """The environment's ``step`` returned ``truncated=True`` (or ``reset``/``step`` raised)."""
    PARSE_FAILURE = "parse_failure"
    """The sampled text could not be parsed; the episode ends with ``failed_parse_reward``."""
    DEADLINE = "deadline"
    """The policy missed its generation deadline twice (the turn was aborted and retried
    once); nothing it produced reached the environment. Reward 0."""
    POLICY_ERROR = "policy_error"
    """The policy failed to answer this episode's turn (its request raised: an endpoint error
    that outlasted the policy's own retries, a request the backend refused); the error is in
    the episode's ``error`` and nothing reached the environment. Reward 0. The other episodes
    go on; a collection whose every episode ends this way raises the ``PolicyError``."""
    TEMPLATE = "template"
    """The model's chat template raised while rendering the episode's conversation
    (:class:`~llm_gym.errors.ChatTemplateError`, its traceback in the episode's ``error``).
    Reward 0; not the environment's error. A collection whose every episode ends this way
    raises the ``ChatTemplateError``."""
    TOKENIZER = "tokenizer"
    """The tokenizer failed to encode or decode the episode's text
    (:class:`~llm_gym.errors.TokenizerError`). Reward 0; not the environment's error. A
    collection whose every episode ends this way raises the ``TokenizerError``."""

    @property
    def gets_overlong_penalty(self) -> bool:
        """Whether the soft overlong penalty applies to episodes ending this way."""
        return self in (TruncationCause.CONTEXT_OVERFLOW, TruncationCause.MAX_TURNS)

    @property
    def is_void(self) -> bool:
        """Whether the infrastructure, not the policy, cut the episode short (a policy error, a
        missed generation deadline, a chat template or tokenizer that failed): such an episode
        says nothing about the policy and trains nothing (it is left out of its group's
        baseline)."""
        return self in (
            TruncationCause.POLICY_ERROR,
            TruncationCause.DEADLINE,
            TruncationCause.TEMPLATE,
            TruncationCause.TOKENIZER,
        )


@dataclass(slots=True)
class StepResult:
    """What ``Env.step`` returns.

    The loop reads ``reward`` and ``metrics`` only from the step that ends the episode, so
    intermediate steps usually return ``0.0`` and put diagnostics in the final step's metrics.
    """

    terminated: bool
    """Task logic ended the episode (for example, a final answer was given)."""
    truncated: bool
    """Something outside task logic cut the episode short (an env-enforced limit)."""
    messages: list[Message]
    """The whole conversation after this step."""
    reward: float = 0.0
    """The episode's reward, when this step ends it."""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    """Diagnostics of the episode, read from the final step (numbers are averaged in reports)."""


_STEP_RESULT = "a StepResult(terminated, truncated, messages, reward=0.0, metrics={})"


def check_messages(messages: Any, where: str, start: int = 0) -> list[Message]:
    """``messages``, what ``where`` (an env's ``reset``, say) returned, checked: a list of
    message dicts, each (from ``start`` on) with a string ``role``.

    Example:
        >>> check_messages(({"role": "user", "content": "hi"},), "Env.reset")
        [{'role': 'user', 'content': 'hi'}]

    Raises:
        InvalidArgumentError: naming ``where``, the message and what came instead.
    """
    if not isinstance(messages, list | tuple):
        raise InvalidArgumentError(
            f"{where} must return a list of message dicts, actual value: {messages!r:.200}."
        )
    for index in range(start, len(messages)):  # every step: exact types first (ABCs are slow)
        message = messages[index]
        kind = type(message)
        if not (
            (kind is dict or kind is FrozenMessage or isinstance(message, Mapping))
            and (type(role := message.get("role")) is str or isinstance(role, str))
        ):
            raise InvalidArgumentError(
                f"{where} returned messages[{index}]={message!r:.100}; each message must be a "
                "dict with a string 'role' and its 'content'."
            )
    return messages if type(messages) is list else list(messages)


def check_step(result: Any, where: str, start: int = 0) -> list[Message]:
    """The messages of ``result`` (what ``where``, an env's ``step``, returned), checked: a
    StepResult-like object whose ``messages`` is a list of message dicts (from ``start`` on,
    each with a string ``role``).

    Raises:
        InvalidArgumentError: naming ``where``, the field and what came instead.
    """
    messages = getattr(result, "messages", None)
    if not hasattr(result, "terminated") or not isinstance(messages, list | tuple):
        raise InvalidArgumentError(
            f"{where} must return {_STEP_RESULT} with a list of message dicts, actual value: "
            f"{result!r:.200}."
        )
    return check_messages(messages, where, start)


def require_turn_limit(value: object, name: str = "max_turns") -> int:
    """``value`` when it is a turn limit (an int >= 1, not a bool), else a clear error.

    Example:
        >>> require_turn_limit(3)
        3
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, actual value: {value!r}.")
    return value


def declared_token_budget(env: Any) -> int | None:
    """The per-turn token budget ``env`` (an env, its class, or a factory carrying the
    attribute) declares as ``max_tokens_per_turn``; None when it declares none.

    Example:
        >>> class Guessing: max_tokens_per_turn = 16
        >>> declared_token_budget(Guessing), declared_token_budget(object())
        (16, None)

    Raises:
        InvalidArgumentError: the declared value is not an int >= 1 (naming the class).
    """
    budget = getattr(env, "max_tokens_per_turn", None)
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        owner = env if isinstance(env, type) else type(env)
        raise InvalidArgumentError(
            f"{getattr(owner, '__qualname__', owner)}.max_tokens_per_turn must be None or an "
            f"int >= 1 (tokens one assistant turn may sample), actual value: {budget!r}."
        )
    return budget


def turn_cap(env: Any) -> int | None:
    """``env``'s own cap on assistant turns (:attr:`Env.max_turns`) when it declares a valid one
    (an int >= 1), else None.

    Example:
        >>> class Capped: max_turns = 3
        >>> turn_cap(Capped()), turn_cap(object())
        (3, None)
    """
    cap = getattr(env, "max_turns", None)
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


async def step_within_cap(env: Any, message: Message, turn: int) -> StepResult:
    """``env.step(message)`` as assistant turn ``turn`` (counted from 1) for a caller that
    steps the env itself (a bridge to another framework's tool loop), with the cap the env asks
    the loop to enforce (:attr:`Env.max_turns`): when ``turn`` reaches the cap and the step did
    not end the episode, the episode ends there as the episode driver ends it: the env's
    ``conclude("max_turns")`` result when it scores cut episodes, else truncated with reward 0.
    """
    result = await env.step(message)
    cap = turn_cap(env)
    if result.terminated or result.truncated or cap is None or turn < cap:
        return result
    conclude = getattr(env, "conclude", None)
    concluded = None if conclude is None else await conclude(str(TruncationCause.MAX_TURNS))
    if concluded is not None:
        return concluded
    return StepResult(False, True, list(result.messages), 0.0, {})


def finite_reward(value: Any, what: str = "reward") -> float:
    """``value`` as a float when it is a finite number (an int, a float, a numpy or torch
    scalar); else :class:`~llm_gym.errors.InvalidArgumentError` naming ``what``.

    Example:
        >>> finite_reward(1), finite_reward(True)
        (1.0, 1.0)
    """
    try:  # text is not a number, even "1.5" (and "nan" would pass float())
        reward = math.nan if isinstance(value, str | bytes) else float(value)
    except (TypeError, ValueError, OverflowError):
        reward = math.nan
    if not math.isfinite(reward):
        raise InvalidArgumentError(
            f"{what}={value!r:.100}; a reward must be a finite number (an int or a float)."
        )
    return reward


def step_outcome(result: Any, where: str) -> tuple[float, dict[str, Any]]:
    """The reward and metrics of the step that ends an episode, checked: the reward a finite
    number (a NaN or infinite reward would poison every advantage of its group), the metrics a
    mapping.

    Example:
        >>> step_outcome(StepResult(True, False, [], reward=1, metrics={"a": 1}), "Env.step")
        (1.0, {'a': 1})
        >>> nan = StepResult(True, False, [], reward=float("nan"))
        >>> step_outcome(nan, "Env.step")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: Env.step returned reward=nan; a reward must be ...

    Raises:
        InvalidArgumentError: naming ``where``, the field and what came instead.
    """
    reward = finite_reward(getattr(result, "reward", None), f"{where} returned reward")
    metrics = getattr(result, "metrics", None)
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError(
            f"{where} returned metrics={metrics!r:.100}; metrics must be a dict (str keys, JSON "
            "values)."
        )
    return reward, dict(metrics)


class Env(abc.ABC):
    """An async multi-turn environment (the cookbook's ``Env``).

    Subclasses implement :meth:`reset`, :meth:`step`, :attr:`tool_specs` and :attr:`messages`;
    override :meth:`close` when ``reset`` starts background work. The loop calls ``close()``
    whenever an episode ends, also when it truncates the episode itself.

    Two switches change how the episode driver (:mod:`llm_gym.rollout.driver`) plays an env,
    :attr:`raw_text_actions` and :attr:`max_turns`; both are read once per episode, right after
    ``reset``; :attr:`tool_choice` is read before every turn.

    Optional hooks, each with a default that does nothing (override what the env needs; the
    rollout loop calls them on every env and probes for none):

    * :meth:`conclude`: score an episode the loop cut short (turn cap, context, deadline).
    * :meth:`defer_scoring`, :attr:`scoring_pending`, :attr:`scoring_key`, :meth:`score_group`:
      score a GRPO group's episodes together once all of them have ended.
    * :meth:`note_tokens`: the loop's count of the episode's tokens before each step.
    """

    tool_choice: Any = None
    """OpenAI's ``tool_choice`` for this env's turns (:attr:`PolicyRequest.tool_choice
    <llm_gym.policies.base.PolicyRequest.tool_choice>`): None (default) or ``"auto"``,
    ``"none"``, ``"required"``, ``{"type": "function", "function": {"name": NAME}}``."""

    raw_text_actions: ClassVar[bool] = False
    """True: ``step`` gets the assistant's raw text as the message's ``content`` and parses it
    itself (plain-text protocols: guesses, document 002's ``<tool_call>`` text), so no reply is
    ever a parse failure. False (default): the driver parses it with the action format and ends
    the episode on a parse failure."""

    max_turns: int | None = None
    """A cap on assistant turns that the loop enforces for this env, when it has one (per task,
    say: set it in ``reset``; document 002's ``max_episode_turns``): the loop ends the episode
    at the smaller of it and the run's ``max_turns``, either way as ``MAX_TURNS`` (and
    ``conclude`` scores it, where the env has one). None (default): the run's limit applies.
    An env that ends an episode itself returns ``truncated=True``: that is ``ENV``, at any
    turn."""

    max_tokens_per_turn: ClassVar[int | None] = None
    """Tokens one assistant turn may sample: what the env's actions need (a guess, a tool call,
    a reply), so that an evaluation of a real model samples no more than the game asks for.
    ``llm-gym eval``, ``llm-gym leaderboard`` and :func:`~llm_gym.eval.run_and_report` use it
    unless the user sets ``max_new_tokens``; a registration may set another
    (``register_env(..., max_tokens_per_turn=...)``). None (default):
    :data:`DEFAULT_MAX_TOKENS_PER_TURN`."""

    @abc.abstractmethod
    async def reset(self, task: Task) -> list[Message]:
        """Start an episode of ``task``; return the opening messages (system, user)."""

    @abc.abstractmethod
    async def step(self, message: Message) -> StepResult:
        """Consume one assistant message (with any tool calls) and return the result."""

    @property
    @abc.abstractmethod
    def tool_specs(self) -> list[ToolSpec]:
        """The tools the model may call, as OpenAI-style specs."""

    @property
    @abc.abstractmethod
    def messages(self) -> list[Message]:
        """The conversation so far (a copy)."""

    async def close(self) -> None:  # noqa: B027 - optional hook with an empty default
        """Release what ``reset`` acquired. Safe to call more than once."""

    # --- optional hooks of the rollout loop -------------------------------------------------------
    async def conclude(self, cause: str) -> StepResult | None:
        """The loop ended the episode itself (``cause``: ``"max_turns"``,
        ``"context_overflow"``, ``"deadline"``): the step that scores the transcript so far, or
        None (default) to keep reward 0 and no metrics."""
        return None

    def defer_scoring(self) -> None:  # noqa: B027 - optional hook with an empty default
        """Called right after ``reset`` by a loop that plays a group of episodes of one task:
        an env that scores a group together (:meth:`score_group`) ends its episodes unscored
        from now on. Default: each episode is scored as it ends."""

    @property
    def scoring_pending(self) -> bool:
        """True when the episode has ended unscored and waits for :meth:`score_group`."""
        return False

    @property
    def scoring_key(self) -> object:
        """Envs whose pending episodes are scored in one :meth:`score_group` call share this
        key (default: the env itself)."""
        return self

    async def score_group(self, members: Sequence[Env]) -> list[StepResult | BaseException]:
        """Score the pending episodes of ``members`` (this env among them, all of one
        :attr:`scoring_key`): per member, its ending step with the score in it, or the
        exception that failed only that episode. Called only when :attr:`scoring_pending`."""
        raise NotImplementedError(f"{type(self).__name__} defers no scoring to its group.")

    def note_tokens(self, total: int) -> None:  # noqa: B027 - optional hook with an empty default
        """The loop's count of the episode's tokens (prompt and every turn, the action about to
        be stepped included), before each step of a model policy."""

    @property
    def synchronous(self) -> bool:
        """True when ``reset``, ``step``, ``conclude`` and ``close`` usually complete without
        suspending (their awaits finish at once), and touch the event loop
        (``asyncio.get_running_loop``, ``create_task``, ``to_thread``) only after an ``await``
        that suspends (``await asyncio.sleep(0)`` is one).

        The one fast path for synchronous callers (``TextEnv``, ``act_sync``): they drive such
        a coroutine directly, without an event loop, and finish on the loop only one that
        suspends, so a True whose call does suspend costs speed, never correctness. A coroutine
        that asks for the running loop before suspending gets ``RuntimeError`` (no running
        loop) and fails its step. :class:`SyncEnv` is True.
        """
        return False


class SyncEnv(Env):
    """An :class:`Env` whose ``reset``, ``step`` and ``close`` never wait on anything, written as
    plain methods.

    Subclasses implement :meth:`reset_sync` and :meth:`step_sync` (and :meth:`close_sync` when
    there is something to release) instead of the async trio, which this class provides on top
    of them, so the rollout loop drives a ``SyncEnv`` like any other ``Env``, and it is
    :attr:`~Env.synchronous`: synchronous callers (``TextEnv``) complete each call without an
    event loop. Override the ``*_sync`` methods, never the async ones.
    """

    @abc.abstractmethod
    def reset_sync(self, task: Task) -> list[Message]:
        """Start an episode of ``task``; return the opening messages (system, user)."""

    @abc.abstractmethod
    def step_sync(self, message: Message) -> StepResult:
        """Consume one assistant message (with any tool calls) and return the result."""

    def close_sync(self) -> None:
        """Release what ``reset_sync`` acquired. Safe to call more than once."""

    async def reset(self, task: Task) -> list[Message]:
        return self.reset_sync(task)

    async def step(self, message: Message) -> StepResult:
        return self.step_sync(message)

    async def close(self) -> None:
        self.close_sync()

    @property
    def synchronous(self) -> bool:
        """Always True: the async methods only call the plain ones."""
        return True
