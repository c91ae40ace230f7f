"""Policies: what produces the assistant's next text. One async, batched interface.

A policy gets a batch of :class:`PolicyRequest` (every episode that awaits an action) and returns
one :class:`Generation` per request. A policy that batches continuously (``HFPolicy``) may also
open a :class:`PolicyStream`: the loop then hands it each episode's turns one at a time, as they
come, and the policy batches them itself. Scripted policies (random, oracle) live here;
model-backed ones (``HFPolicy``, ``OpenAIPolicy``) in their own modules.
"""

from __future__ import annotations

import abc
import json
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolCall, ToolSpec

__all__ = [
    "Generation",
    "Oracle",
    "OraclePolicy",
    "Policy",
    "PolicyRequest",
    "PolicyStream",
    "RandomPolicy",
]

Oracle = Callable[[Task, list[Message]], Message]
"""An environment's scripted expert: ``(task, messages so far) -> next assistant message``."""


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


_WORDS = ("velmora", "tarsk", "population", "key", "answer", "42", "area", "yes", "no", "town")


class RandomPolicy(Policy):
    """A floor: random well-formed tool calls (random tool, random argument values) or a random
    short reply, with a seeded ``random.Random`` of its own.
    """

    name = "random"

    def __init__(self, seed: int = 0, tool_call_probability: float = 0.5) -> None:
        self.seed = seed
        self.tool_call_probability = tool_call_probability
        self._rng = random.Random(seed)

    def _value(self, schema: dict[str, Any]) -> Any:
        kind = schema.get("type")
        if "enum" in schema:
            return self._rng.choice(schema["enum"])
        if kind == "integer":
            return self._rng.randint(-10, 1000)
        if kind == "number":
            return round(self._rng.uniform(-10, 1000), 2)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "array":
            return [self._value(schema.get("items", {})) for _ in range(self._rng.randint(0, 3))]
        if kind == "object":
            return {}
        words = self._rng.sample(_WORDS, self._rng.randint(1, 3))
        return self._rng.choice([".", " ", "_"]).join(words)

    def _one(self, request: PolicyRequest) -> Generation:
        if request.tool_specs and self._rng.random() < self.tool_call_probability:
            spec = self._rng.choice(request.tool_specs)["function"]
            properties = spec.get("parameters", {}).get("properties", {})
            arguments = {name: self._value(s) for name, s in properties.items()}
            call: ToolCall = {
                "id": "random_0",
                "type": "function",
                "function": {"name": spec["name"], "arguments": json.dumps(arguments)},
            }
            text = request.action_format.render_tool_calls([call])
        else:
            text = self._rng.choice([str(self._rng.randint(0, 10_000)), self._rng.choice(_WORDS)])
        return Generation(text=text)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        return [self._one(r) for r in requests]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "tool_call_probability": self.tool_call_probability,
        }


class OraclePolicy(Policy):
    """The environment's scripted expert, rendered as text in the episode's action format."""

    name = "oracle"

    def __init__(self, oracle: Oracle | None = None) -> None:
        self.oracle = oracle

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        generations = []
        for request in requests:
            oracle = self.oracle or request.oracle
            if oracle is None:
                raise ValueError(
                    "OraclePolicy needs an oracle: pass one, or use an environment registered "
                    "with oracle=... ."
                )
            message = oracle(request.task, list(request.messages))
            generations.append(Generation(text=request.action_format.render_message(message)))
        return generations


POLICY_SPECS = "oracle, random, random:SEED, hf:PATH, openai:MODEL@URL"


def policy_from_spec(spec: str, *, seed: int = 0, **kwargs: Any) -> Policy:
    """Build a policy from a short spec: ``oracle``, ``random``, ``random:SEED``, ``hf:PATH``
    (a local directory or hub id loaded with ``from_pretrained``) or ``openai:MODEL@URL``.

    Extra keyword arguments go to the model policy's constructor.
    """
    from llm_gym.errors import InvalidArgumentError

    kind, _, rest = spec.partition(":")
    if kind == "oracle" and not rest:
        return OraclePolicy()
    if kind == "random":
        return RandomPolicy(seed=int(rest) if rest else seed)
    if kind == "hf" and rest:
        from llm_gym.rollout.hf_policy import HFPolicy

        return HFPolicy.from_pretrained(rest, seed=seed, **kwargs)
    if kind == "openai" and "@" in rest:
        from llm_gym.rollout.openai_policy import OpenAIPolicy

        model, _, base_url = rest.partition("@")
        return OpenAIPolicy(model=model, base_url=base_url, seed=seed, **kwargs)
    raise InvalidArgumentError(f"Unknown policy spec {spec!r}; expected one of: {POLICY_SPECS}.")
