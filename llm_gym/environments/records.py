"""Document 002's records: ``TaskExample``, ``RewardResult`` and the episode dataclasses.

``EnvironmentStepResult``, ``EnvironmentTurn`` and ``EnvironmentEpisode`` are the frozen
dataclasses of document 002's "Full multi-turn contract", with the same fields and defaults.
``TaskExample`` converts to and from llm_gym's :class:`~llm_gym.core.Task`
(``input`` <-> ``prompt``, ``output`` <-> ``target``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "ChatMessage",
    "EnvironmentEpisode",
    "EnvironmentStepResult",
    "EnvironmentTurn",
    "RewardResult",
    "TaskExample",
]

ChatMessage: TypeAlias = dict[str, Any]
"""One chat message as document 002 writes it: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True)
class TaskExample:
    """One dataset row: what the model gets (``input``) and what the reward checks (``output``).

    Example:
        >>> TaskExample(input="Refund my last order.", output="refund_order").to_task().target
        'refund_order'
    """

    input: str
    """The request, shown to the model (``Task.prompt``)."""
    output: Any = None
    """The reference: a scalar answer, or a target transcript for SFT (``Task.target``)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the environment needs (``Task.metadata``)."""
    id: str | None = None
    """A stable identifier within the dataset (``Task.id``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.input, str):
            raise InvalidArgumentError(
                f"TaskExample.input must be a str, actual type: {type(self.input).__name__}."
            )
        if not isinstance(self.metadata, Mapping):
            raise InvalidArgumentError(
                f"TaskExample.metadata must be a mapping, actual type: "
                f"{type(self.metadata).__name__}."
            )

    def to_task(self) -> Task:
        """The same row as an llm_gym :class:`Task` (``input`` -> ``prompt``, ``output`` ->
        ``target``)."""
        return Task(prompt=self.input, target=self.output, metadata=self.metadata, id=self.id)

    @classmethod
    def from_task(cls, task: Task) -> TaskExample:
        """The example of an llm_gym :class:`Task` (``prompt`` -> ``input``, ``target`` ->
        ``output``)."""
        return cls(input=task.prompt, output=task.target, metadata=task.metadata, id=task.id)

    @classmethod
    def coerce(cls, value: Any) -> TaskExample:
        """A ``TaskExample`` from a ``TaskExample``, a ``Task``, a prompt string or a dict with
        ``input``/``output`` (or ``prompt``/``target``) keys."""
        if isinstance(value, TaskExample):
            return value
        if isinstance(value, Task):
            return cls.from_task(value)
        if isinstance(value, str):
            return cls(input=value)
        if isinstance(value, Mapping):
            return cls.from_task(Task.from_dict(value))
        raise InvalidArgumentError(
            "Expected a TaskExample, a Task, a prompt string or a dict with 'input'/'output' "
            f"keys, actual value: {value!r:.200}."
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"input", "output", "metadata", "id"}``."""
        return {
            "input": self.input,
            "output": self.output,
            "metadata": dict(self.metadata),
            "id": self.id,
        }


@dataclass(frozen=True)
class RewardResult:
    """What ``score_episode`` returns: the reward of one trajectory.

    ``metadata["per_turn_rewards"]`` (one finite number per sampled assistant turn, in order)
    gives each assistant turn its own reward (per-turn credit); other numeric metadata entries
    are reported as episode metrics.

    Example:
        >>> RewardResult(score=1.0, threshold=1.0).passed
        True
    """

    score: float
    """The episode's reward."""
    threshold: float | None = None
    """The score from which the episode counts as a success (``None``: no success notion)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Diagnostics; ``per_turn_rewards`` is read for per-turn credit."""

    def __post_init__(self) -> None:
        if isinstance(self.score, bool) or not isinstance(self.score, int | float):
            raise InvalidArgumentError(
                f"RewardResult.score must be a number, actual value: {self.score!r:.100}."
            )
        if not math.isfinite(self.score):
            raise InvalidArgumentError(
                f"RewardResult.score must be finite, actual value: {self.score!r}."
            )
        object.__setattr__(self, "score", float(self.score))
        if self.threshold is not None:
            if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
                raise InvalidArgumentError(
                    f"RewardResult.threshold must be None or a number, actual value: "
                    f"{self.threshold!r:.100}."
                )
            object.__setattr__(self, "threshold", float(self.threshold))
        if not isinstance(self.metadata, Mapping):
            raise InvalidArgumentError(
                f"RewardResult.metadata must be a mapping, actual type: "
                f"{type(self.metadata).__name__}."
            )

    @property
    def passed(self) -> bool | None:
        """``score >= threshold``; ``None`` when no threshold is set."""
        if self.threshold is None:
            return None
        return self.score >= self.threshold

    @property
    def per_turn_rewards(self) -> Any:
        """``metadata["per_turn_rewards"]`` as given (``None`` when absent)."""
        return self.metadata.get("per_turn_rewards")


@dataclass(frozen=True)
class EnvironmentStepResult:
    """What ``step_episode`` returns.

    ``messages`` holds only the new environment-side messages to append after the assistant
    action (never the action itself). ``done=True`` ends the episode; ``final_response_text``
    then replaces the last assistant message as the text passed to scoring. ``metadata`` is
    appended to the finished episode's ``metadata["steps"]``.
    """

    done: bool = True
    messages: tuple[ChatMessage, ...] = ()
    final_response_text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvironmentTurn:
    """One message of a finished episode after the seeded ``start_episode`` prompt.

    ``metadata["sampled"]`` is True for the assistant actions the policy sampled and False for
    environment messages; ``metadata["action"]`` is the 0-based index of the action the message
    is (or answers).
    """

    role: str
    content: str
    name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvironmentEpisode:
    """One finished trajectory, as ``score_episode`` receives it.

    ``messages`` is the whole transcript (seeded prompt included); ``turns`` excludes the seeded
    prompt but includes environment replies; ``metadata["steps"]`` lists the metadata of every
    ``step_episode`` result in order.
    """

    messages: tuple[ChatMessage, ...]
    response_text: str
    turns: tuple[EnvironmentTurn, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    latency_ms: int | None = None
    total_tokens: int | None = None
