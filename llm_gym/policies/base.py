"""The policy interface: what produces the assistant's next text. One async, batched interface.

A policy gets a batch of :class:`PolicyRequest` (every episode that awaits an action) and returns
one :class:`Generation` per request. A policy that batches continuously (``HFPolicy``) may also
open a :class:`PolicyStream`: the loop then hands it each episode's turns one at a time, as they
come, and the policy batches them itself. Backends live in their own modules of this package and
are created by name through :mod:`llm_gym.policies.registry`.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.factories import Oracle
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, LlmGymError

__all__ = [
    "Generation",
    "Oracle",
    "Policy",
    "PolicyBatchError",
    "PolicyError",
    "PolicyRequest",
    "PolicyStream",
]


class PolicyError(LlmGymError, RuntimeError):
    """The policy itself failed (not the model's output).

    The episode loop ends the episodes whose turn failed as ``POLICY_ERROR`` (the error kept in
    each record) and lets the others go on; it stops the collection with this error when every
    episode of it failed so (the policy looks down), or at once when the error is ``fatal``.

    Args:
        fatal: Nothing this policy would answer can succeed (bad credentials, a wrong URL, a
            closed engine): the collection stops at the first such error instead of ending
            episodes one by one.
    """

    fatal: bool = False
    """Whether the error concerns every request, not just the one(s) that raised it."""

    def __init__(self, *args: object, fatal: bool = False) -> None:
        super().__init__(*args)
        self.fatal = fatal


class PolicyBatchError(PolicyError):
    """Some requests of one ``act`` call failed and others did not; raised by a backend that
    knows which (one HTTP request per episode, say), so that the loop ends only the episodes
    whose request failed and keeps the others' generations, sending nothing twice.

    Args:
        message: What failed, for the log.
        outcomes: One per request, in order: its :class:`Generation`, or the exception that
            failed it.
    """

    def __init__(self, message: str, outcomes: Sequence[Generation | BaseException]) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)


@dataclass
class PolicyRequest:
    """One episode waiting for its next action."""

    messages: list[Message]
    """The conversation so far (the policy answers its last message)."""
    tool_specs: list[ToolSpec]
    """The tools the environment offers."""
    task: Task
    """The episode's task (scripted policies read it; model policies must not)."""
    action_format: ActionFormat
    """How tool calls are written as text; the loop parses the reply with it."""
    max_new_tokens: int | None = None
    """The generation budget of this turn (``None``: the policy's own default)."""
    prompt_ids: list[int] | None = None
    """Token-in/token-out: the exact ids to continue (model policies), when the loop keeps them."""
    oracle: Oracle | None = None
    """The environment's scripted expert, when it has one."""
    tool_choice: Any = None
    """OpenAI's ``tool_choice``: None or ``"auto"`` (the model may call a tool), ``"none"``,
    ``"required"`` (the reply must call one of ``tool_specs``) or ``{"type": "function",
    "function": {"name": NAME}}`` (it must call ``NAME``). A policy that decodes locally
    (``hf``) enforces a forced choice by constrained decoding
    (:mod:`llm_gym.policies.constraint`, the ``grammar`` extra), in the reply's
    ``action_format``; an environment asks for it with a ``tool_choice`` attribute."""


@dataclass
class Generation:
    """One sampled assistant turn."""

    text: str
    """The assistant's text, as the action format will parse it."""
    token_ids: list[int] | None = None
    """The sampled token ids (model policies)."""
    logprobs: list[float] | None = None
    """The sampler's log-probability of each sampled token, aligned with ``token_ids``."""
    finish_reason: str = "stop"
    """``"stop"`` (end of turn) or ``"length"`` (hit the token budget)."""
    policy_versions: list[int] | None = None
    """The weight version that sampled each token, aligned with ``token_ids``, when the
    backend's weights are versioned (async training); None otherwise."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else a backend reports (latency, retries)."""


class Policy(abc.ABC):
    """Produces the next assistant text for a batch of episodes."""

    name: str = "policy"

    @abc.abstractmethod
    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        """One generation per request, in order."""

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description that goes into every record the policy produced."""
        return {"name": self.name}

    @classmethod
    def from_spec(cls, argument: str = "", **options: Any) -> Policy:
        """Build the policy from a spec's argument (the text after ``kind:``, ``""`` when there
        is none) and keyword options; :func:`~llm_gym.policies.registry.policy_from_spec` calls
        it. The default takes no argument and passes the options to the constructor."""
        if argument:
            raise InvalidArgumentError(
                f"{cls.__name__} takes no argument after its kind, actual value: {argument!r}."
            )
        return cls(**options)

    def finish(self) -> None:  # noqa: B027 - optional hook with an empty default
        """A collection that used this policy is over. A collective backend (vLLM's server
        mode) answers the other processes' rounds here until every one is done."""

    def open_stream(self) -> PolicyStream | None:
        """A continuous-batching session for one collection, or None (the default): the loop
        then sends :meth:`act` one batch per wave of waiting episodes."""
        return None


class PolicyStream(abc.ABC):
    """One collection's continuous-batching session (see :meth:`Policy.open_stream`).

    Every episode sends its turns under its own key; the stream may keep per-episode state
    (a KV cache) between them until :meth:`release`. It must batch the turns of many episodes
    together: it is not one model call per episode.
    """

    calls: int = 0
    """Batched model calls so far (forward passes)."""
    batch_sizes: list[int]
    """Episodes served by each call."""

    @abc.abstractmethod
    async def act(self, key: Hashable, request: PolicyRequest) -> Generation:
        """The next turn of episode ``key``."""

    @abc.abstractmethod
    def release(self, key: Hashable) -> None:
        """Episode ``key`` ended: drop what the stream holds for it."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """End the session (every episode has ended)."""
