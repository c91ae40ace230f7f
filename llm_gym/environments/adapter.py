"""Run an :class:`EnvironmentMultiTurn` as an llm_gym :class:`~llm_gym.core.Env`.

:class:`MultiTurnEnvAdapter` plays document 002's episode loop one ``step`` at a time, so a
document-002 environment runs in ``collect_groups``, ``run_and_report``, ``TextEnv`` /
``gym.make`` and the trainer, unchanged:

* ``reset(task)``: ``start_episode(TaskExample.from_task(task), prompt_text)``; the turn cap is
  ``max_episode_turns(example)``.
* ``step(message)``: appends ``{"role": "assistant", "content": <raw text>}`` and calls
  ``step_episode``. Document 002 environments parse the raw assistant text themselves, so the
  adapter declares ``raw_text_actions = True`` and the loop and ``TextEnv`` hand it the sampled
  text unparsed. (A parsed message with ``tool_calls`` is rendered back to Hermes text.)
* The episode ends on ``done`` (``terminated=True``). ``max_episode_turns`` is the loop's
  limit, as in document 002: the adapter declares it as :attr:`~MultiTurnEnvAdapter.max_turns`
  and the runner ends the episode there (``MAX_TURNS``; a step past it is refused). The ending
  is scored, as in document 002's loop: the ending ``StepResult`` carries ``reward = score``
  and metrics (``score``, ``success`` when the :class:`RewardResult` has a threshold,
  ``per_turn_rewards`` from its metadata).
* A runner that ends the episode itself (its turn limit or ``max_episode_turns``, a context
  overflow, a missed generation deadline) calls :meth:`~MultiTurnEnvAdapter.conclude`: the
  transcript so far is scored like any other (document 002 scores every episode its loop ran).
  A caller that steps the adapter itself uses :func:`llm_gym.core.env.step_within_cap`.
* Group scoring: the rollout loop calls :meth:`~MultiTurnEnvAdapter.defer_scoring` on each
  episode of a GRPO group, and once every episode of the group has ended it scores them with one
  ``score_episodes(example, episodes)`` call (:meth:`~MultiTurnEnvAdapter.score_group`), as
  document 002 describes. Without it (``TextEnv``, one episode) each episode is scored as it
  ends.

:class:`~llm_gym.environments.factory.MultiTurnEnvFactory` builds adapters over one shared
environment object.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_gym.core.env import Env, StepResult
from llm_gym.core.factories import as_task
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.environments.multi_turn import EnvironmentMultiTurn
from llm_gym.environments.records import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentStepResult,
    EnvironmentTurn,
    RewardResult,
    TaskExample,
)
from llm_gym.environments.replay import SAMPLED_KEY
from llm_gym.environments.scoring import call_hook, score_each
from llm_gym.errors import InvalidArgumentError

__all__ = ["MultiTurnEnvAdapter"]

_RESERVED_METRICS = frozenset(
    {"score", "success", "threshold", "per_turn_rewards", "actions", "turn_cap_reached"}
)


def _public(message: ChatMessage) -> Message:
    """The message without the adapter's ``sampled`` marker (what the policy sees)."""
    if SAMPLED_KEY in message and message.get("role") == "assistant":
        message = {k: v for k, v in message.items() if k != SAMPLED_KEY}
    return message  # type: ignore[return-value]


def _check_messages(value: Any, where: str) -> list[ChatMessage]:
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidArgumentError(
            f"{where} must be a list or tuple of message dicts, actual value: {value!r:.200}."
        )
    out: list[ChatMessage] = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidArgumentError(
                f"{where}[{i}] must be a dict with a string 'role', actual value: {message!r:.200}."
            )
        out.append(dict(message))
    return out


class MultiTurnEnvAdapter(Env):
    """An :class:`EnvironmentMultiTurn` as an async llm_gym :class:`Env` (one episode at a time).

    Args:
        environment: The document-002 environment (shared; it must keep no per-episode state).
        prompt_text: Passed to ``start_episode`` (document 002's configured prompt text).
        offload_hooks: Run synchronous hooks in worker threads, so slow hooks (a service call, a
            judge) do not hold up the event loop the other episodes run on.
        group_scoring: :meth:`score_group` scores a group with one ``score_episodes`` call;
            False: one call per episode.

    After the episode ends, :attr:`environment_episode` and :attr:`reward_result` hold what was
    scored.
    """

    raw_text_actions: ClassVar[bool] = True
    """The loop and ``TextEnv`` hand ``step`` the raw sampled text (the env parses it itself)."""

    def __init__(
        self,
        environment: EnvironmentMultiTurn,
        prompt_text: str = "",
        *,
        offload_hooks: bool = False,
        group_scoring: bool = True,
    ) -> None:
        if not isinstance(environment, EnvironmentMultiTurn):
            raise InvalidArgumentError(
                f"Expected an EnvironmentMultiTurn instance, actual value: {environment!r:.200}."
            )
        if not isinstance(prompt_text, str):
            raise InvalidArgumentError(
                f"prompt_text must be a str, actual type: {type(prompt_text).__name__}."
            )
        self.environment = environment
        self.prompt_text = prompt_text
        self.offload_hooks = bool(offload_hooks)
        self.group_scoring = bool(group_scoring)
        self._defer = False
        self._unscored: tuple[bool, EnvironmentEpisode] | None = None
        self._task: Task | None = None
        self._example: TaskExample | None = None
        self._transcript: list[ChatMessage] = []
        self._public: list[Message] = []
        self._prompt_length = 0
        self._cap: int | None = None
        self._actions = 0
        self._steps: list[dict[str, Any]] = []
        self._response_text = ""
        self._done = False
        self._start = 0.0
        self.environment_episode: EnvironmentEpisode | None = None
        """The scored episode, once the episode has ended."""
        self.reward_result: RewardResult | None = None
        """Its :class:`RewardResult`, once the episode has ended."""

    # --- the Env contract ----------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        task = as_task(task)
        example = TaskExample.from_task(task)
        env = self.environment
        name = type(env).__qualname__
        opening = await call_hook(
            env.start_episode, example, self.prompt_text, offload=self.offload_hooks
        )
        messages = _check_messages(opening, f"{name}.start_episode(...)")
        cap = await call_hook(env.max_episode_turns, example, offload=self.offload_hooks)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise InvalidArgumentError(
                f"{name}.max_episode_turns must return an int >= 1, actual value: {cap!r}."
            )
        self._task, self._example, self._cap = task, example, cap
        self._tokens: int | None = None
        self._transcript, self._public = [], []
        self._append_env(messages)
        self._prompt_length = len(messages)
        self._actions = 0
        self._steps = []
        self._response_text = ""
        self._done = False
        self._unscored = None
        self._start = time.perf_counter()
        self.environment_episode = None
        self.reward_result = None
        return list(self._public)

    async def step(self, message: Message) -> StepResult:
        if self._example is None or self._task is None:
            raise InvalidArgumentError("Call reset(task) before step(message).")
        if self._done:
            raise InvalidArgumentError("The episode has ended; call reset(task) to start another.")
        assert self._cap is not None
        if self._actions >= self._cap:
            raise InvalidArgumentError(
                f"The episode has had its max_episode_turns={self._cap} actions: the loop ends "
                "it there with conclude('max_turns') (see llm_gym.core.env.step_within_cap)."
            )
        text = self._raw_text(message)
        env, example = self.environment, self._example
        name = type(env).__qualname__
        action: ChatMessage = {"role": "assistant", "content": text, SAMPLED_KEY: True}
        self._transcript.append(action)
        self._public.append(_public(action))
        self._actions += 1
        result = await call_hook(
            env.step_episode,
            example,
            [dict(m) for m in self._transcript],
            text,
            offload=self.offload_hooks,
        )
        if not isinstance(result, EnvironmentStepResult):
            raise InvalidArgumentError(
                f"{name}.step_episode must return an EnvironmentStepResult, actual value: "
                f"{result!r:.200}."
            )
        self._append_env(_check_messages(result.messages, f"{name}.step_episode(...).messages"))
        if result.final_response_text is not None:
            self._response_text = str(result.final_response_text)
        else:
            self._response_text = text
        self._steps.append(dict(result.metadata or {}))
        if not result.done:
            return StepResult(terminated=False, truncated=False, messages=list(self._public))
        return await self._finish(done=True, cut=None)

    @property
    def tool_specs(self) -> list[ToolSpec]:
        """``[]``: document 002's protocol is plain text (unless the environment declares
        ``tool_specs``)."""
        specs = getattr(self.environment, "tool_specs", None)
        if callable(specs):
            specs = specs()
        return list(specs or [])

    @property
    def messages(self) -> list[Message]:
        return list(self._public)

    @property
    def synchronous(self) -> bool:
        return not self.offload_hooks

    # --- the runner's extras --------------------------------------------------------------------
    def defer_scoring(self) -> None:
        """Score this episode with the rest of its group (:meth:`score_group`), not when it ends:
        the ending step then carries reward 0 and no metrics until the group is scored."""
        self._defer = True

    @property
    def scoring_pending(self) -> bool:
        """The episode has ended and waits for :meth:`score_group`."""
        return self._unscored is not None

    @property
    def scoring_key(self) -> object:
        """The shared environment object: adapters over one environment are scored together."""
        return self.environment

    async def conclude(self, cause: str) -> StepResult | None:
        """The runner ended the episode itself (``cause``: ``"max_turns"``, ``"context_overflow"``,
        ``"deadline"``): score the transcript so far. The scored step, or None when the episode
        had already ended or its scoring is deferred to the group."""
        if self._example is None or self._done:
            return None
        at_cap = cause == "max_turns" and self._cap is not None and self._actions >= self._cap
        return await self._finish(done=False, cut=None if at_cap else cause)

    async def score_group(
        self, members: Sequence[MultiTurnEnvAdapter]
    ) -> list[StepResult | BaseException]:
        """Score the pending episodes of ``members`` (episodes of one task, this one among them)
        with one ``score_episodes`` call (one per episode without ``group_scoring``). Each
        member's result is its ending step with the score in it, or the exception its
        ``score_episode`` raised (only that episode fails)."""
        items = [m._unscored for m in members]
        if any(item is None for item in items) or self._example is None:
            raise InvalidArgumentError("score_group takes adapters whose scoring is pending.")
        episodes = [episode for _, episode in items]  # type: ignore[misc]
        if self.group_scoring:
            try:
                rewards = await score_each(
                    self.environment, self._example, episodes, self.offload_hooks
                )
            except Exception as exc:  # score_episodes itself failed: so did every episode
                rewards = [exc] * len(members)
        else:
            rewards = []
            for episode in episodes:
                rewards.extend(
                    await score_each(self.environment, self._example, [episode], self.offload_hooks)
                )
        results: list[StepResult | BaseException] = []
        for member, reward in zip(members, rewards, strict=True):
            done = member._unscored[0]  # type: ignore[index]
            member._unscored = None
            if isinstance(reward, BaseException):
                results.append(reward)
            else:
                results.append(member._scored(reward, done))
        return results

    # --- extras --------------------------------------------------------------------------------
    def note_tokens(self, total: int) -> None:
        """The rollout loop's count of the episode's tokens so far (prompt and every turn, the
        action being stepped included): the scored episode's ``total_tokens``."""
        self._tokens = int(total)

    @property
    def max_turns(self) -> int | None:
        """``max_episode_turns`` of the current example (``None`` before ``reset``): the cap
        the runner enforces (:attr:`llm_gym.core.Env.max_turns`)."""
        return self._cap

    @property
    def example(self) -> TaskExample | None:
        """The current episode's example."""
        return self._example

    @property
    def transcript(self) -> list[ChatMessage]:
        """The conversation as the hooks see it (sampled actions marked ``"sampled": True``)."""
        return [dict(m) for m in self._transcript]

    # --- internals -----------------------------------------------------------------------------
    @staticmethod
    def _raw_text(message: Message) -> str:
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"step takes an assistant message dict, actual value: {message!r:.200}."
            )
        if message.get("tool_calls"):
            # A loop that parsed the text itself: render it back as the model would write it.
            from llm_gym.actions import get_action_format

            return get_action_format("hermes").render_message(message)
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def _append_env(self, messages: list[ChatMessage]) -> None:
        for message in messages:
            if message.get("role") == "assistant":
                message[SAMPLED_KEY] = False  # a demonstration or an env reply, never sampled
            self._transcript.append(message)
            self._public.append(_public(message))

    def _build_episode(self, *, turn_cap_reached: bool, cut: str | None) -> EnvironmentEpisode:
        turns = []
        action = -1
        for message in self._transcript[self._prompt_length :]:
            sampled = message.get("role") == "assistant" and message.get(SAMPLED_KEY) is True
            action += sampled
            content = message.get("content")
            turns.append(
                EnvironmentTurn(
                    role=str(message.get("role")),
                    content=content if isinstance(content, str) else "",
                    name=message.get("name"),
                    metadata={"sampled": sampled, "action": max(action, 0)},
                )
            )
        return EnvironmentEpisode(
            messages=tuple(dict(m) for m in self._transcript),
            response_text=self._response_text,
            turns=tuple(turns),
            metadata={
                "steps": list(self._steps),
                "max_episode_turns": self._cap,
                "turn_cap_reached": turn_cap_reached,
                "ended_by": cut or ("environment" if not turn_cap_reached else "max_episode_turns"),
            },
            latency_ms=int((time.perf_counter() - self._start) * 1000),
            total_tokens=self._tokens,
        )

    async def _finish(self, *, done: bool, cut: str | None) -> StepResult:
        self._done = True
        assert self._example is not None and self._task is not None
        episode = self._build_episode(
            turn_cap_reached=not done and cut in (None, "max_turns"), cut=cut
        )
        self.environment_episode = episode
        self._unscored = (done, episode)
        if self._defer:
            return StepResult(
                terminated=done, truncated=not done, messages=list(self._public), reward=0.0
            )
        [result] = await self.score_group([self])
        if isinstance(result, BaseException):
            raise result
        return result

    def _scored(self, reward: RewardResult, done: bool) -> StepResult:
        self.reward_result = reward
        return StepResult(
            terminated=done,
            truncated=not done,
            messages=list(self._public),
            reward=reward.score,
            metrics=self._metrics(reward, done),
        )

    def _metrics(self, reward: RewardResult, done: bool) -> dict[str, Any]:
        metrics: dict[str, Any] = {
            "score": reward.score,
            "actions": self._actions,
            "turn_cap_reached": 0 if done else 1,
        }
        for key, value in reward.metadata.items():
            if (
                key not in _RESERVED_METRICS
                and isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                metrics[key] = value
        if reward.threshold is not None:
            metrics["success"] = bool(reward.passed)
            metrics["threshold"] = reward.threshold
        per_turn = reward.metadata.get("per_turn_rewards")
        if per_turn is not None:
            # Validated by the loop against its assistant turns (invalid: ignored with a warning).
            metrics["per_turn_rewards"] = (
                list(per_turn) if isinstance(per_turn, tuple) else per_turn
            )
        return metrics
