"""The environment contract: ``Env``, ``StepResult`` and ``TruncationCause``.

An environment owns the conversation history, tool dispatch and the rule for when an episode
ends. The loop that drives it owns tokenization and sampling.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec

__all__ = ["Env", "StepResult", "SyncEnv", "TruncationCause"]


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

    @property
    def gets_overlong_penalty(self) -> bool:
        """Whether the soft overlong penalty applies to episodes ending this way."""
        return self in (TruncationCause.CONTEXT_OVERFLOW, TruncationCause.MAX_TURNS)


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


class Env(abc.ABC):
    """An async multi-turn environment (the cookbook's ``Env``).

    Subclasses implement :meth:`reset`, :meth:`step`, :attr:`tool_specs` and :attr:`messages`;
    override :meth:`close` when ``reset`` starts background work. The loop calls ``close()``
    whenever an episode ends, also when it truncates the episode itself.

    Two switches change how the episode driver (:mod:`llm_gym.rollout.driver`) plays an env,
    :attr:`raw_text_actions` and :attr:`max_turns`; both are read once per episode, right after
    ``reset``.
    """

    raw_text_actions: ClassVar[bool] = False
    """True: ``step`` gets the assistant's raw text as the message's ``content`` and parses it
    itself (plain-text protocols: guesses, document 002's ``<tool_call>`` text), so no reply is
    ever a parse failure. False (default): the driver parses it with the action format and ends
    the episode on a parse failure."""

    max_turns: int | None = None
    """The env's own cap on assistant turns, when it has one (per task, say: set it in
    ``reset``); the episode ends at the smaller of it and the run's ``max_turns``, either way
    as ``MAX_TURNS``. None (default): the run's limit applies."""

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

    @property
    def synchronous(self) -> bool:
        """True when ``reset``, ``step`` and ``close`` never await real I/O.

        Synchronous callers (``TextEnv``) then run them without an event loop round trip, which
        makes a step several times cheaper. Leave it False unless every await inside completes at
        once; a coroutine that suspends anyway is finished on the event loop, so a wrong True
        costs speed, never correctness.
        """
        return False


class SyncEnv(Env):
    """An :class:`Env` whose ``reset``, ``step`` and ``close`` never wait on anything, written as
    plain methods.

    Subclasses implement :meth:`reset_sync` and :meth:`step_sync` (and :meth:`close_sync` when
    there is something to release) instead of the async trio, which this class provides on top
    of them, so the rollout loop drives a ``SyncEnv`` like any other ``Env``. Synchronous callers
    (``TextEnv``) call the plain methods directly: no coroutine and no event loop at all, which
    halves the cost of a cheap step. Override the ``*_sync`` methods, never the async ones.
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
