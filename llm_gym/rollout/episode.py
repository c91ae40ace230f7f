"""The record of an episode: ``Episode`` (its turns, its ending, its token samples) and ``Turn``.

One :class:`Episode` carries an episode from its start to the trainer's batch: the
:class:`~llm_gym.rollout.driver.EpisodeDriver` makes it and writes its ending (:meth:`Episode.end`),
the rollout loop adds the transcript, the turns and the token samples
(:class:`~llm_gym.rollout.tokens.TokenSample`), and what reward shaping reads is its properties
(:attr:`Episode.total_tokens`, :attr:`Episode.per_turn_rewards`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_gym.actions import ActionFormat, ParseKind, get_action_format
from llm_gym.core.env import TruncationCause
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec

if TYPE_CHECKING:
    from llm_gym.rollout.tokens import TokenSample

__all__ = ["Episode", "Turn"]


@dataclass
class Turn:
    """One assistant turn and what the environment answered."""

    text: str
    """The assistant's raw text, as sampled."""
    parse_kind: ParseKind
    """Final answer, tool calls, or parse failure."""
    message: Message
    """The structured assistant message the environment received."""
    parse_error: str | None = None
    """The parser's reason, for a parse failure."""
    env_messages: list[Message] = field(default_factory=list)
    """The messages the environment appended after this action (tool results, a user turn)."""
    tool_calls: int = 0
    """Tool calls in this action."""
    tool_errors: int = 0
    """Tool results of this turn that start with ``tool_error``."""
    token_ids: list[int] | None = None
    """Sampled token ids (model policies)."""
    logprobs: list[float] | None = None
    """The sampler's log-probabilities, aligned with ``token_ids``."""
    finish_reason: str = "stop"
    """``"stop"`` or ``"length"``."""
    policy_versions: list[int] | None = None
    """The weight version that sampled each token (async training), aligned with
    ``token_ids``."""
    reward: float | None = None
    """This turn's own reward, when the environment grades turns (per-turn credit)."""


@dataclass
class Episode:
    """One episode: the transcript, how it ended, its reward and its token samples.

    Example:
        >>> episode = Episode(Task("q"), 0, 0, [], [], 0.0, False, False)
        >>> episode.end(1.0, metrics={"solved": 1})
        >>> episode.terminated, episode.truncated, episode.reward, episode.metrics
        (True, False, 1.0, {'solved': 1})
    """

    task: Task
    """The task it played."""
    group: int
    """Index of its group (its task's position in the collected batch)."""
    index: int
    """Its index within the group."""
    messages: list[Message]
    """The whole conversation, opening messages included."""
    turns: list[Turn]
    """The assistant turns in order."""
    reward: float
    """The final reward (from the ending step; ``failed_parse_reward`` on a parse failure;
    0.0 when the loop truncated it or the environment raised)."""
    terminated: bool
    """The environment ended it (task logic)."""
    truncated: bool
    """It ended any other way; see :attr:`truncation_cause`."""
    truncation_cause: TruncationCause | None = None
    """Why it was truncated (``None`` when terminated)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The environment's metrics from the ending step."""
    tool_specs: list[ToolSpec] = field(default_factory=list)
    """The tools the environment offered."""
    num_opening_messages: int = 0
    """How many of :attr:`messages` came from ``reset`` (the prompt)."""
    error: str | None = None
    """The traceback when the environment's ``reset``, ``step`` or ``close`` raised."""
    prompt_tokens: int = 0
    """Tokens of the opening prompt (when a tokenizer is known)."""
    completion_tokens: int = 0
    """Tokens the policy sampled over the whole episode."""
    wall_time_s: float = 0.0
    """Seconds from reset to close."""
    samples: list[TokenSample] = field(default_factory=list)
    """Token samples built by the loop (token-in/token-out policies); they train with this
    episode's :attr:`reward` and :attr:`per_turn_rewards`."""
    action_format: ActionFormat = field(default_factory=lambda: get_action_format("hermes"))
    """The action format the episode's replies were parsed with (it also writes the tools into
    the prompt of a template that cannot render them): the instance, so a custom format renders
    again as it rendered."""
    env_id: str | None = None
    """The environment's name in a mixture of several (set by the collection that ran it;
    ``trainers.mixture.env``), else None."""
    overflow_tokens: int = 0
    """When an environment reply too long for the context ended it (``CONTEXT_OVERFLOW``) and
    was read only in part: the tokens the context would have held at least, which the soft
    overlong penalty measures (the samples stop before that reply); else 0."""

    def end(
        self,
        reward: float,
        truncation_cause: TruncationCause | None = None,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Write how the episode ended: ``reward``; terminated exactly when ``truncation_cause``
        is None, else truncated for that cause; ``metrics`` (None: none); an ``error``
        (a traceback) goes before any error already recorded."""
        self.reward = reward
        self.terminated = truncation_cause is None
        self.truncated = not self.terminated
        self.truncation_cause = truncation_cause
        self.metrics = {} if metrics is None else metrics
        if error is not None:
            self.error = error + (self.error or "")

    def transcript(self) -> list[Message]:
        """The conversation as the policy wrote it: the opening messages, then each turn's raw
        text as an assistant message (plain ``content``, no structured ``tool_calls``) and the
        environment's replies (copies)."""
        messages = [dict(m) for m in self.messages[: self.num_opening_messages]]
        for turn in self.turns:
            messages.append({"role": "assistant", "content": turn.text})
            messages.extend(dict(m) for m in turn.env_messages)
        return messages  # type: ignore[return-value]

    @property
    def num_turns(self) -> int:
        """Assistant turns taken."""
        return len(self.turns)

    @property
    def per_turn_rewards(self) -> list[float] | None:
        """One reward per assistant turn, when the environment graded every turn."""
        rewards = [t.reward for t in self.turns]
        if not rewards or any(r is None for r in rewards):
            return None
        return [float(r) for r in rewards]  # type: ignore[arg-type]

    @property
    def total_tokens(self) -> int:
        """Its length in tokens when it ended, as the soft overlong penalty measures it: its
        longest token sample (prompt and completion), or what an environment reply too long for
        the context needed (:attr:`overflow_tokens`), whichever is more; 0 without either."""
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in self.samples]
        return max([*lengths, self.overflow_tokens or 0])

    @property
    def tool_calls(self) -> int:
        """Tool calls over the whole episode."""
        return sum(t.tool_calls for t in self.turns)

    @property
    def tool_errors(self) -> int:
        """Tool results that were errors, over the whole episode."""
        return sum(t.tool_errors for t in self.turns)
