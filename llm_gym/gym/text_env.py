"""``TextEnv``: any async :class:`~llm_gym.core.Env` as a real ``gymnasium.Env`` over text.

Observations and actions are strings. ``step(action_text)`` parses the assistant text with the
environment's action format (``hermes`` by default), hands the structured message to the inner
``Env`` and returns the text of the environment's reply.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import pickle
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import gymnasium

from llm_gym.actions import ActionFormat, ParseKind, get_action_format
from llm_gym.aio import LoopRunner
from llm_gym.core.env import Env, StepResult, SyncEnv, TruncationCause
from llm_gym.core.task import Task
from llm_gym.core.types import FrozenMessage, Message, freeze_message
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym.spaces import UnicodeText

__all__ = [
    "DEFAULT_FAILED_PARSE_REWARD",
    "SPLITS",
    "EnvFactory",
    "FrozenMessage",
    "TaskSource",
    "TextEnv",
    "render_transcript",
    "copy_messages",
    "freeze_message",
    "resolve",
]

T = TypeVar("T")
EnvFactory = Callable[[Task], Env]
"""Builds a fresh environment for one episode (the seeds' ``env_factory``)."""
TaskSource = Callable[[str], Sequence[Task]]
"""Returns the tasks of a split (``"train"``, ``"val"`` or ``"test"``)."""

SPLITS = ("train", "val", "test")
DEFAULT_FAILED_PARSE_REWARD = -0.1
"""The reward of an episode whose last action could not be parsed (the seeds' default)."""
MAX_OBSERVATION_CHARS = 1_000_000
MAX_ACTION_CHARS = 1_000_000


def resolve(obj: T | str) -> T:
    """Resolve ``"package.module:attribute"`` to the attribute; pass anything else through."""
    if not isinstance(obj, str):
        return obj
    module_name, sep, attr = obj.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(
            f"Expected an object or a 'module:attribute' string, actual value: {obj!r}."
        )
    value: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


class _SameEnv:
    """Factory that returns one environment instance for every task (picklable)."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def __call__(self, task: Task) -> Env:
        return self.env


class _NoArgFactory:
    """Factory that calls a class or function without the task (picklable)."""

    def __init__(self, factory: Callable[[], Env]) -> None:
        self.factory = factory

    def __call__(self, task: Task) -> Env:
        return self.factory()


class _StaticTasks:
    """Task source over fixed lists (picklable)."""

    def __init__(self, by_split: Mapping[str, Sequence[Task]] | None, tasks: Sequence[Task]):
        self.by_split = None if by_split is None else {k: list(v) for k, v in by_split.items()}
        self.tasks = list(tasks)

    def __call__(self, split: str) -> Sequence[Task]:
        if self.by_split is None:
            return self.tasks
        if split not in self.by_split:
            raise InvalidArgumentError(
                f"No tasks for split {split!r}; available splits: {sorted(self.by_split)}."
            )
        return self.by_split[split]


def _as_env_factory(env: Env | type[Env] | EnvFactory | str) -> EnvFactory:
    env = resolve(env)
    # Document 002's EnvironmentMultiTurn (an instance or a subclass) runs through its adapter.
    from llm_gym.environments import EnvironmentMultiTurn, MultiTurnEnvFactory

    if isinstance(env, EnvironmentMultiTurn) or (
        isinstance(env, type) and issubclass(env, EnvironmentMultiTurn)
    ):
        return MultiTurnEnvFactory(env)
    if isinstance(env, Env):
        return _SameEnv(env)
    if isinstance(env, type):
        if not issubclass(env, Env):
            raise InvalidArgumentError(
                f"Expected an llm_gym Env subclass, actual class: {env.__qualname__}."
            )
        return _NoArgFactory(env)
    if callable(env):
        try:
            takes_task = bool(inspect.signature(env).parameters)
        except (TypeError, ValueError):
            takes_task = True
        return env if takes_task else _NoArgFactory(env)
    raise InvalidArgumentError(
        f"Expected an Env, an Env class, a factory task -> Env or a 'module:attr' string, "
        f"actual value: {env!r}."
    )


def _as_task_source(tasks: Any) -> TaskSource:
    tasks = resolve(tasks)
    if callable(tasks):
        return tasks
    if isinstance(tasks, Mapping):
        return _StaticTasks(tasks, [])
    if isinstance(tasks, Sequence) and not isinstance(tasks, str):
        return _StaticTasks(None, tasks)
    raise InvalidArgumentError(
        "Expected tasks as a sequence of Task, a mapping split -> tasks, a callable split -> "
        f"tasks or a 'module:attr' string, actual value: {tasks!r}."
    )


def _as_task(value: Any) -> Task:
    if isinstance(value, Task):
        return value
    if isinstance(value, str):
        return Task(prompt=value)
    if isinstance(value, Mapping):
        return Task.from_dict(value)
    raise InvalidArgumentError(
        f"options['task'] must be a Task, a dict or a prompt string, actual value: {value!r}."
    )


def copy_messages(messages: Sequence[Message]) -> list[Message]:
    """A deep copy of chat messages, about ten times faster than ``copy.deepcopy``.

    Messages are dicts of strings plus ``tool_calls`` (a list of dicts holding a ``function``
    dict); any other nested value falls back to ``copy.deepcopy``.
    """
    out: list[Message] = []
    for message in messages:
        clone = dict(message)
        for value in clone.values():
            if type(value) is not str:
                break
        else:  # the common case: every value is a string
            out.append(clone)  # type: ignore[arg-type]
            continue
        for key, value in clone.items():
            kind = type(value)
            if kind is str or value is None or kind is int or kind is float or kind is bool:
                continue
            if key == "tool_calls" and kind is list:
                clone[key] = [
                    {**call, "function": dict(call["function"])}
                    if type(call) is dict and type(call.get("function")) is dict
                    else copy.deepcopy(call)
                    for call in value
                ]
            else:
                clone[key] = copy.deepcopy(value)
        out.append(clone)  # type: ignore[arg-type]
    return out


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
    ``UnicodeText(max_action_chars)``: the assistant's text, parsed by the action format.

    ## Observation Space
    ``UnicodeText(max_observation_chars)``; structured messages are in ``info["messages"]``.

    ## Reward
    The inner environment's reward on the step that ends the episode; ``failed_parse_reward``
    when the action could not be parsed; 0.0 otherwise.

    ## Episode End
    Terminated when the inner env terminates. Truncated after ``max_turns`` assistant turns
    (``MAX_TURNS``), on an unparseable action (``PARSE_FAILURE``), or when the inner env truncates
    or raises (``ENV``); ``info["truncation_cause"]`` names the cause.

    ## Info
    ``messages``, ``tool_specs``, ``task``, ``split``, ``turn``; on the last step also
    ``metrics``, ``parse_error`` (for parse failures), ``env_error`` (a traceback) and
    ``truncation_cause`` when truncated.

    ## Arguments
    ``env`` (an Env, an Env class, a factory ``task -> Env``, or ``"module:attr"``), ``tasks``
    (sequence, mapping split -> tasks, callable ``split -> tasks`` or ``"module:attr"``),
    ``action_format`` (``"hermes"`` or ``"json"``), ``max_turns``, ``split``,
    ``failed_parse_reward``, ``oracle`` (``(task, messages) -> Message``), ``render_mode``.
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
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise InvalidArgumentError(
                f"render_mode must be None or one of {self.metadata['render_modes']}, "
                f"actual value: {render_mode!r}."
            )
        if not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidArgumentError(
                f"max_turns must be an int >= 1, actual value: {max_turns!r}."
            )
        if split not in SPLITS:
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
        self._env_factory = _as_env_factory(env)
        self._task_source = _as_task_source(tasks)
        self.action_format = get_action_format(action_format)
        self._oracle = resolve(oracle) if oracle is not None else None
        self.max_turns = max_turns
        self.split = split
        self.failed_parse_reward = float(failed_parse_reward)
        self.render_mode = render_mode
        self.version = version
        self.observation_space = UnicodeText(max_observation_chars)
        self.action_space = UnicodeText(max_action_chars)
        self._runner = LoopRunner()
        self._env: Env | None = None
        self._specs_pickle: bytes | None = None
        self._rendered_specs: dict[str, str] = {}
        self._task: Task | None = None
        self._task_split = split
        self._messages: list[Message] = []
        self._turn = 0
        self._done = False
        self._eager = False
        self._step_sync: Callable[[Message], StepResult] | None = None
        self._raw_text = False
        self._limit = max_turns
        self._frozen_source: list[Message] = []
        self._frozen: list[Message] = []

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
        if "task" in options:
            return _as_task(options["task"]), split
        tasks = self.tasks(split)
        if not tasks:
            raise InvalidArgumentError(f"The {split!r} split has no tasks.")
        if "index" in options:
            index = options["index"]
            if not isinstance(index, int) or not -len(tasks) <= index < len(tasks):
                raise InvalidArgumentError(
                    f"options['index'] must be an int in [0, {len(tasks)}), "
                    f"actual value: {index!r}."
                )
            return tasks[index], split
        return tasks[int(self.np_random.integers(len(tasks)))], split

    # --- gymnasium API -------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task, split = self._pick_task(options or {})
        self._close_inner()
        self._env = env = self._env_factory(task)
        self._specs_pickle = None
        self._frozen_source, self._frozen = [], []
        self._task, self._task_split = task, split
        self._turn = 0
        self._done = False
        if isinstance(env, SyncEnv):  # plain methods: no coroutine, no event loop
            self._messages = list(env.reset_sync(task))
            self._step_sync = env.step_sync
        else:
            self._messages = list(self._runner.run(env.reset(task), eager=env.synchronous))
            self._step_sync = None
        # Read once per episode what every step needs (the hot path stays attribute lookups).
        self._eager = env.synchronous
        self._raw_text = bool(getattr(env, "raw_text_actions", False))
        env_cap = getattr(env, "max_turns", None)  # an env that caps its own episodes
        self._limit = env_cap if isinstance(env_cap, int) and env_cap > 0 else self.max_turns
        observation = self._opening_text(self._messages)
        return self._clip(observation), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        env = self._env
        if env is None or self._task is None:
            raise gymnasium.error.ResetNeeded("Call reset() before step().")
        if self._done:
            raise gymnasium.error.ResetNeeded(
                "The episode has ended; call reset() before step() again."
            )
        if type(action) is not str and not isinstance(action, str):
            raise InvalidArgumentError(
                f"Expected the action as a str (the assistant's text), actual type: "
                f"{type(action).__name__}."
            )
        self._turn += 1
        if self._raw_text:
            # The env parses the assistant text itself (document 002's EnvironmentMultiTurn
            # adapter): hand it the raw text; there is no parse failure to end the episode on.
            message: Message = {"role": "assistant", "content": action}
        else:
            parsed = self.action_format.parse(action, call_id_prefix=f"call_t{self._turn}")
            if parsed.kind is ParseKind.PARSE_FAILURE:
                self._messages = [*self._messages, parsed.message]
                extra = {"parse_error": parsed.error, "metrics": {}}
                return self._end(self.failed_parse_reward, TruncationCause.PARSE_FAILURE, extra)
            message = parsed.message
        before = len(self._messages) + 1
        step_sync = self._step_sync
        try:
            if step_sync is not None:
                result: StepResult = step_sync(message)
            else:
                result = self._runner.run(env.step(message), self._eager)
        except Exception:
            self._messages = [*self._messages, message]
            extra = {"env_error": traceback.format_exc(), "metrics": {}}
            return self._end(0.0, TruncationCause.ENV, extra)
        self._messages = messages = list(result.messages)
        if len(messages) == before + 1 and messages[before].get("role") != "tool":
            observation = messages[before].get("content") or ""  # one plain reply: no join
        else:
            observation = self._reply_text(messages[before:])
        if result.terminated or result.truncated:
            cause = None if result.terminated else TruncationCause.ENV
            extra = {"metrics": dict(result.metrics)}
            return self._end(float(result.reward), cause, extra, observation)
        if self._turn >= self._limit:
            return self._end(0.0, TruncationCause.MAX_TURNS, {"metrics": {}}, observation)
        if len(observation) > self.observation_space.max_length:
            observation = self._clip(observation)
        return observation, 0.0, False, False, self._info()

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return render_transcript(self._messages)
        return None

    def close(self) -> None:
        self._close_inner()
        self._runner.close()
        super().close()

    # --- helpers -------------------------------------------------------------------------------
    def oracle_action(self) -> str:
        """The registered oracle's next action, rendered as text in this env's action format."""
        if self._oracle is None:
            raise InvalidArgumentError("This environment was registered without an oracle.")
        if self._task is None:
            raise gymnasium.error.ResetNeeded("Call reset() before oracle_action().")
        return self.action_format.render_message(self._oracle(self._task, list(self._messages)))

    @property
    def inner_env(self) -> Env | None:
        """The async :class:`Env` of the current episode."""
        return self._env

    @property
    def task(self) -> Task | None:
        """The current episode's task."""
        return self._task

    def _end(
        self,
        reward: float,
        cause: TruncationCause | None,
        extra: dict[str, Any],
        observation: str = "",
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._done = True
        info = self._info()
        info.update(extra)
        if cause is not None:
            info["truncation_cause"] = cause
        self._close_inner()
        return self._clip(observation), reward, cause is None, cause is not None, info

    def _opening_text(self, messages: Sequence[Message]) -> str:
        parts = []
        specs = self._env.tool_specs if self._env is not None else []
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
        if self._env is not None and self._specs_pickle is None:
            specs = self._env.tool_specs
            self._specs_pickle = pickle.dumps(specs) if specs else b""
        return {
            "messages": self._messages_view(),
            # A fresh copy each call (gymnasium's checker forbids sharing objects between infos);
            # unpickling our own bytes is twice as fast as json.loads or copy.deepcopy.
            "tool_specs": pickle.loads(self._specs_pickle) if self._specs_pickle else [],
            "task": self._task,
            "split": self._task_split,
            "turn": self._turn,
        }

    def _messages_view(self) -> list[Message]:
        """A new list of read-only copies of the conversation, each message frozen only once.

        Messages are append-only in the ``Env`` contract; when the known prefix no longer
        equals what was frozen (an env that rewrote history), everything is frozen again. The
        comparison is a C-level list compare that short-cuts on identity, so it costs ~5 ns a
        message.
        """
        messages, source, frozen = self._messages, self._frozen_source, self._frozen
        known = len(source)
        if known > len(messages) or source != messages[:known]:
            source.clear()
            frozen.clear()
            known = 0
        for message in messages[known:]:
            source.append(message)
            if type(message) is FrozenMessage:  # read-only from birth: safe to share as it is
                frozen.append(message)
            elif len(message) == 2 and type(message.get("content")) is type(message["role"]) is str:
                frozen.append(FrozenMessage(message))
            else:
                frozen.append(freeze_message(message))
        return list(frozen)

    def _close_inner(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            self._step_sync = None
            if isinstance(env, SyncEnv):
                env.close_sync()
            else:
                self._runner.run(env.close(), eager=env.synchronous)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runner"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runner = LoopRunner()
