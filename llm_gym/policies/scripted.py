"""Scripted policies: a random floor and the environment's oracle, rendered as text."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from llm_gym.core.factories import Oracle
from llm_gym.core.types import ToolCall
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.base import Generation, Policy, PolicyRequest

__all__ = ["OraclePolicy", "RandomPolicy"]

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

    @classmethod
    def from_spec(
        cls, argument: str = "", *, seed: int = 0, tool_call_probability: float = 0.5
    ) -> RandomPolicy:
        """``random`` (seeded with ``seed``) or ``random:SEED``."""
        if argument and not argument.isdigit():
            raise InvalidArgumentError(
                f"Expected 'random' or 'random:SEED' with SEED an integer >= 0, actual value: "
                f"'random:{argument}'."
            )
        return cls(seed=int(argument) if argument else seed,
                   tool_call_probability=tool_call_probability)  # fmt: skip


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
                raise InvalidArgumentError(
                    "OraclePolicy needs an oracle: pass one, or use an environment registered "
                    "with oracle=... ."
                )
            message = oracle(request.task, list(request.messages))
            generations.append(Generation(text=request.action_format.render_message(message)))
        return generations

    @classmethod
    def from_spec(cls, argument: str = "") -> OraclePolicy:
        """``oracle``: the episode's registered oracle (deterministic: it takes no seed)."""
        if argument:
            raise InvalidArgumentError(
                f"'oracle' takes no argument, actual value: 'oracle:{argument}'."
            )
        return cls()
