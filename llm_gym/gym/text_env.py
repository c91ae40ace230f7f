"""``TextEnv``: any async :class:`~llm_gym.core.Env` as a real ``gymnasium.Env`` over text.

Observations and actions are strings. ``TextEnv`` is a text view over one
:class:`~llm_gym.rollout.driver.EpisodeDriver`, which owns the rules of an episode (parsing,
parse failures, turn caps, truncation causes); ``step(action_text)`` hands the text to the driver
and returns the text of the environment's reply.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium

from llm_gym.actions import ActionFormat
from llm_gym.aio import LoopRunner
from llm_gym.core.env import Env, TruncationCause
from llm_gym.core.factories import (
    SPLITS,
    EnvFactory,
    NoArgFactory,
    as_env_factory,
    as_task,
    as_task_source,
    resolve,
    with_task_options,
)
from llm_gym.core.task import Task
from llm_gym.core.types import FrozenMessage, Message, freeze_message, freeze_spec
from llm_gym.errors import InvalidArgumentError, did_you_mean
from llm_gym.gym.spaces import UnicodeText
from llm_gym.rollout.driver import (
    DEFAULT_FAILED_PARSE_REWARD,
    MAX_ACTION_CHARS,
    EpisodeDriver,
    require_turn_limit,
)
from llm_gym.rollout.episode import Episode

__all__ = ["TextEnv", "render_transcript"]


MAX_OBSERVATION_CHARS = 1_000_000


def render_transcript(messages: Sequence[Message]) -> str:
    """A readable transcript: one block per message, headed by its role (and tool calls)."""
    blocks = []
    for message in messages:
        role = message.get("role", "?")
        head = f"[{role}]" if role != "tool" else f"[tool {message.get('name', '')}]"
        body = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            body += f"\n-> {function.get('name')}({function.get('arguments')})"
        blocks.append(f"{head}\n{body.strip()}")
    return "\n\n".join(blocks) + "\n"


class TextEnv(gymnasium.Env[str, str]):
    """A gymnasium environment over text, wrapping an async multi-turn :class:`Env`.

    ## Description
    Each episode is one :class:`Task`. The observation after ``reset`` is the opening text (the
    system prompt, the tools rendered by the action format, the user's prompt); the observation
    after ``step`` is the text of the environment's reply (tool results), empty when it ended.

    ## Action Space
    ``UnicodeText(max_action_chars)``: the assistant's text, parsed by the action format. A
    longer text is model output like any other, not a caller error: the step ends the episode
    as ``PARSE_FAILURE`` (``info["parse_error"]`` gives its length and the limit) and the inner
    env never sees it. A lone surrogate in the text reaches the env as U+FFFD.

    ## Observation Space
    ``UnicodeText(max_observation_chars)``; structured messages are in ``info["messages"]``.
    Observations are valid UTF-8: a lone surrogate the inner env wrote becomes U+FFFD.

    ## Reward
    The inner environment's reward on the step that ends the episode; ``failed_parse_reward``
    when the action could not be parsed; 0.0 otherwise.

    ## Episode End
    Terminated when the inner env terminates. Truncated after ``max_turns`` assistant turns
    (``MAX_TURNS``), on an unparseable action (``PARSE_FAILURE``), or when the inner env truncates
    or raises (``ENV``); ``info["truncation_cause"]`` names the cause.

    ## Info
    ``messages``, ``tool_specs`` (new lists of read-only entries: ``FrozenMessage`` dicts,
    ``FrozenList`` lists; ``dict(entry)`` gives an editable copy), ``task``, ``split``,
    ``turn``; on the last step also
    ``metrics``, ``parse_error`` (for parse failures), ``env_error`` (a traceback) and
    ``truncation_cause`` when truncated.

    ## Arguments
    ``env`` (an Env, an Env class, a factory ``task -> Env``, or ``"module:attr"``), ``tasks``
    (sequence, mapping split -> tasks, callable ``split -> tasks`` or ``"module:attr"``),
    ``action_format`` (``"hermes"`` or ``"json"``), ``max_turns``, ``split``,
    ``failed_parse_reward``, ``oracle`` (``(task, messages) -> Message``), ``render_mode``,
    ``env_kwargs`` (keyword arguments of the Env class, e.g. ``{"tool_latency_s": 1.0}`` to
    simulate slow tools), ``task_options`` (keyword arguments of a callable task source, e.g.
    ``{"world_seed": 1}``: ToolUseGame's questions in a world with other facts).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        env: Env | type[Env] | EnvFactory | str,
        tasks: Any,
        *,
        action_format: str | ActionFormat = "hermes",
        max_turns: int = 8,
        split: str = "train",
        failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD,
        oracle: Callable[[Task, list[Message]], Message] | str | None = None,
        render_mode: str | None = None,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
        max_action_chars: int = MAX_ACTION_CHARS,
        version: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        task_options: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise InvalidArgumentError(self._unknown_arguments(sorted(unknown)))
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise InvalidArgumentError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, "
                f"actual value: {render_mode!r}."
            )
        if split not in SPLITS:
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
        self._runner = LoopRunner()
        self._driver = EpisodeDriver(
            _env_factory(env, env_kwargs),
            action_format=action_format,
            max_turns=max_turns,
            failed_parse_reward=failed_parse_reward,
            runner=self._runner,
            max_action_chars=max_action_chars,
        )
        self._task_source = with_task_options(
            as_task_source(tasks), task_options or {}, where="this environment"
        )
        self.action_format = self._driver.action_format
        self._oracle = resolve(oracle) if oracle is not None else None
        self.split = split
        self.render_mode = render_mode
        self.version = version
        self.observation_space = UnicodeText(max_observation_chars)
        self._max_observation = self.observation_space.max_length
        self.action_space = UnicodeText(max_action_chars)
        self._frozen_specs: list[Any] = []
        self._rendered_specs: dict[str, str] = {}
        self._task_split = split
        self._live = False  # an episode is running (reset() and no end yet)
        self._frozen_source: list[Message] = []
        self._frozen: list[Message] = []

    @classmethod
    def _unknown_arguments(cls, names: list[str]) -> str:
        """The error for keyword arguments ``gym.make`` passed that this class does not take."""
        taken = [  # a subclass's own keywords, then those it passes on to TextEnv
            name
            for klass in cls.__mro__
            if issubclass(klass, TextEnv) and "__init__" in vars(klass)
            for name, parameter in inspect.signature(klass.__init__).parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        taken = list(dict.fromkeys(taken))
        return (
            f"{cls.__name__} takes no argument(s) {names}; it takes {taken}. The environment's "
            "own options go in env_kwargs={...} and its task source's in task_options={...}."
            + did_you_mean(names[0], taken)
        )

    @property
    def max_turns(self) -> int:
        """Assistant turns before ``MAX_TURNS`` (the episode driver's; settable)."""
        return self._driver.max_turns

    @max_turns.setter
    def max_turns(self, value: int) -> None:
        self._driver.max_turns = require_turn_limit(value)

    @property
    def failed_parse_reward(self) -> float:
        """The reward of an episode that ends on an unparseable action (settable)."""
        return self._driver.failed_parse_reward

    @failed_parse_reward.setter
    def failed_parse_reward(self, value: float) -> None:
        self._driver.failed_parse_reward = float(value)

    # --- tasks -------------------------------------------------------------------------------
    def tasks(self, split: str | None = None) -> Sequence[Task]:
        """The tasks of ``split`` (default: this env's split)."""
        split = self.split if split is None else split
        if split not in SPLITS:
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
        return self._task_source(split)

    def _pick_task(self, options: Mapping[str, Any]) -> tuple[Task, str]:
        unknown = sorted(set(options) - {"task", "split", "index"})
        if unknown:
            raise InvalidArgumentError(
                f"Unknown reset options {unknown}; allowed: 'task', 'split', 'index'."
            )
        split = options.get("split", self.split)
        if split not in SPLITS:
            raise InvalidArgumentError(
                f"options['split'] must be one of {SPLITS}, actual value: {split!r}."
            )
        if "task" in options:
            if "index" in options:
                raise InvalidArgumentError(
                    "Give options['task'] or options['index'], not both: the index picks a task "
                    "of the split."
                )
            return as_task(options["task"], "options['task']"), split
        tasks = self.tasks(split)
        if not tasks:
            raise InvalidArgumentError(f"The {split!r} split has no tasks.")
        if "index" in options:
            index = options["index"]
            if (
                isinstance(index, bool)
                or not isinstance(index, numbers.Integral)
                or not 0 <= index < len(tasks)
            ):
                raise InvalidArgumentError(
                    f"options['index'] must be an int in [0, {len(tasks)}), "
                    f"actual value: {index!r}."
                )
        else:
            index = int(self.np_random.integers(len(tasks)))
        # A task source is code: what it gives must be a task (a dict or a prompt becomes one).
        return as_task(tasks[int(index)], f"task {index} of the {split!r} split"), split

    # --- gymnasium API -------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task, split = self._pick_task(options or {})
        driver = self._driver
        self._live = False  # until the new episode has started (a failing reset ends it here)
        driver.close_sync()
        self._frozen_source, self._frozen = [], []
        self._task_split = split
        messages = driver.start_sync(task)
        # Frozen once per episode and shared: each info gets a new list of the same read-only
        # specs (as info["messages"] holds read-only messages), where it unpickled a fresh copy
        # (3-7 us a step for ToolUseGame's three tools, more with more tools).
        self._frozen_specs = [freeze_spec(spec) for spec in driver.tool_specs or ()]
        self._live = True
        return self._clip(self._opening_text(messages)), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._live:
            raise gymnasium.error.ResetNeeded(
                "The episode has ended; call reset() before step() again."
                if self._driver.ended
                else "Call reset() before step()."
            )
        if type(action) is not str and not isinstance(action, str):
            raise InvalidArgumentError(
                f"Expected the action as a str (the assistant's text), actual type: "
                f"{type(action).__name__}."
            )
        driver = self._driver
        ending = driver.act_sync(action)
        messages, start = driver.messages, driver.reply_start
        if len(messages) == start + 1 and messages[start].get("role") != "tool":
            observation = messages[start].get("content") or ""  # one plain reply: no join
        else:
            observation = self._reply_text(messages[start:])
        if ending is not None:
            return self._end(ending, observation)
        if len(observation) > self._max_observation:
            observation = self._clip(observation)
        return observation, 0.0, False, False, self._info()

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return render_transcript(self._driver.messages)
        return None

    def close(self) -> None:
        self._driver.close_sync()
        self._runner.close()
        super().close()

    # --- helpers -------------------------------------------------------------------------------
    def oracle_action(self) -> str:
        """The registered oracle's next action, rendered as text in this env's action format."""
        if self._oracle is None:
            raise InvalidArgumentError("This environment was registered without an oracle.")
        task = self._driver.task
        if task is None:
            raise gymnasium.error.ResetNeeded("Call reset() before oracle_action().")
        return self.action_format.render_message(self._oracle(task, list(self._driver.messages)))

    @property
    def messages(self) -> list[Message]:
        """The conversation so far, as the environment holds it (a new list; copy a message
        with ``dict(message)`` before editing it). ``info["messages"]`` has read-only copies."""
        return list(self._driver.messages)

    @property
    def inner_env(self) -> Env | None:
        """The async :class:`Env` of the current episode."""
        return self._driver.env

    @property
    def task(self) -> Task | None:
        """The current episode's task."""
        return self._driver.task

    def _end(
        self, ending: Episode, observation: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._live = False
        info = self._info()
        info["metrics"] = ending.metrics  # the driver's own copy of the env's metrics
        parsed = self._driver.parsed  # the parse that failed, on a parse failure
        if ending.truncation_cause is TruncationCause.PARSE_FAILURE and parsed is not None:
            info["parse_error"] = parsed.error
        if ending.error is not None:
            info["env_error"] = ending.error
        cause = ending.truncation_cause
        if cause is not None:
            info["truncation_cause"] = cause
        self._driver.close_sync()
        return self._clip(observation), ending.reward, cause is None, cause is not None, info

    def _opening_text(self, messages: Sequence[Message]) -> str:
        parts = []
        specs = self._driver.tool_specs
        for message in messages:
            if message.get("role") == "system":
                parts.append(message.get("content") or "")
        if specs:
            key = json.dumps(specs)
            if key not in self._rendered_specs:
                self._rendered_specs[key] = self.action_format.render_tool_specs(specs)
            parts.append(self._rendered_specs[key])
        for message in messages:
            if message.get("role") != "system":
                parts.append(message.get("content") or "")
        return "\n\n".join(p for p in parts if p)

    def _reply_text(self, messages: Sequence[Message]) -> str:
        parts = []
        for message in messages:
            if message.get("role") == "tool":
                parts.append(self.action_format.render_tool_result(message))
            else:
                parts.append(message.get("content") or "")
        return "\n".join(parts)

    def _clip(self, text: str) -> str:
        limit = self.observation_space.max_length
        return text if len(text) <= limit else text[: limit - 20] + "\n[observation cut]"

    def _info(self) -> dict[str, Any]:
        """The info dict. ``messages`` is a new list of read-only copies of the conversation,
        each message frozen only once: messages are append-only in the ``Env`` contract, and
        when the known prefix no longer equals what was frozen (an env that rewrote history)
        everything is frozen again (the check is a C-level list compare that short-cuts on
        identity). One function on the step's hot path, on purpose."""
        driver = self._driver
        messages, source, frozen = driver.messages, self._frozen_source, self._frozen
        known = len(source)
        if known > len(messages) or source != messages[:known]:
            source.clear()
            frozen.clear()
            known = 0
        new = messages[known:]
        source += new
        for message in new:
            if type(message) is FrozenMessage:  # read-only from birth: safe to share as it is
                frozen.append(message)
            elif len(message) == 2 and type(message.get("content")) is type(message["role"]) is str:
                frozen.append(FrozenMessage(message))
            else:
                frozen.append(freeze_message(message))
        return {
            "messages": list(frozen),
            "tool_specs": list(self._frozen_specs),
            "task": driver.task,
            "split": self._task_split,
            "turn": driver.turn,
        }

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runner"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # Read-only entries pickle as plain dicts and lists: freeze them again before sharing
        self._frozen = [freeze_message(message) for message in self._frozen]
        self._frozen_specs = [freeze_spec(spec) for spec in self._frozen_specs]
        self._runner = LoopRunner()
        self._driver.runner = self._runner


def _env_factory(env: Any, env_kwargs: dict[str, Any] | None) -> EnvFactory:
    """``env``'s factory; with ``env_kwargs`` each episode's env is ``EnvClass(**env_kwargs)``
    (``gym.make("ToolUseGame-v0", env_kwargs={"tool_latency_s": 1.0})``)."""
    if not env_kwargs:
        return as_env_factory(env)
    cls = resolve(env)
    if not isinstance(cls, type) or not isinstance(env_kwargs, dict):
        raise InvalidArgumentError(
            f"env_kwargs needs an Env class (or its 'module:attr' name) and a dict, actual "
            f"values: env={env!r}, env_kwargs={env_kwargs!r}."
        )
    return NoArgFactory(functools.partial(cls, **env_kwargs))
