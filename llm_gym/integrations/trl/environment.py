"""TRL's own trainer on llm_gym environments: ``GRPOTrainer(environment_factory=...)``.

TRL 1.16 plays an environment through a class it instantiates once per rollout: ``reset(**row)``
starts an episode of the dataset row, every other public method is a tool the model may call
(its JSON schema read from the method's signature and docstring), and reward functions receive
the instances as ``environments``. :func:`environment_factory` builds that class for any
registered llm_gym environment (or env factory), :func:`trl_dataset` the rows it resets from, and
:func:`env_reward` the reward: the completion's final reply is sent to the environment as its last
step, and the environment's own reward is read back.

    from trl import GRPOConfig, GRPOTrainer
    from llm_gym.integrations.trl import env_reward, environment_factory, trl_dataset

    trainer = GRPOTrainer(
        model="path/to/model",
        args=GRPOConfig(max_tool_calling_iterations=7, ...),
        train_dataset=trl_dataset("ToolUseGame-v0", "train"),
        environment_factory=environment_factory("ToolUseGame-v0"),
        reward_funcs=[env_reward],
    )

Each tool method carries the environment's own tool spec (name, description, parameter types
and descriptions), so the model sees the tools it would see in our loop; :func:`our_rendering`
goes one step further and makes a tokenizer render exactly our specs, in our order (TRL lists
methods alphabetically and transformers' schema drops an empty ``required``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llm_gym.aio import LoopRunner
from llm_gym.core.env import TruncationCause, require_turn_limit
from llm_gym.core.registry import as_env_entry
from llm_gym.core.task import Task, task_key
from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.driver import EpisodeDriver
from llm_gym.rollout.episode import Episode

__all__ = ["env_reward", "environment_factory", "our_rendering", "task_key", "trl_dataset"]

_PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}
TASK_ID = "task_id"
"""The dataset column that names each row's task."""


def _tool_method(spec: Mapping[str, Any]) -> Callable[..., str]:
    """A method named after the tool, with a signature and Google-style docstring made from its
    JSON schema, that runs the tool in the instance's episode."""
    function = spec["function"]
    name = function["name"]
    schema = function.get("parameters") or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    if not name.isidentifier():
        raise InvalidArgumentError(
            f"Tool name {name!r} is not a Python identifier: TRL calls tools as methods."
        )
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for argument, argument_schema in properties.items():
        kind = _PYTHON_TYPES.get(str(argument_schema.get("type")), str)
        optional = argument not in required
        annotations[argument] = kind  # optional: default None, left out of the call
        parameters.append(
            inspect.Parameter(
                argument,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None if optional else inspect.Parameter.empty,
                annotation=annotations[argument],
            )
        )
    annotations["return"] = str
    lines = [str(function.get("description") or name)]
    if properties:
        lines += ["", "Args:"]
        for argument, argument_schema in properties.items():
            lines.append(f"    {argument}: {argument_schema.get('description') or argument}")

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self" and v is not None}
        return self._call(name, arguments)

    signature = inspect.Signature(parameters, return_annotation=str)
    method.__name__ = method.__qualname__ = name
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__doc__ = "\n".join(lines)
    return method


class _Episode:
    """One rollout's episode of an llm_gym environment, as TRL drives it (the base of the class
    :func:`environment_factory` returns).

    The episode runs on an :class:`~llm_gym.rollout.EpisodeDriver`, so TRL's tool loop gets our
    loop's rules: each tool call is written in the env's action format and parsed back, text is
    cleaned, steps and rewards are checked, ``env_timeout_s`` bounds every env call, the turn
    limit is the smaller of ``max_turns`` and the env's own cap (an env that scores cut episodes
    is concluded), and a failing step ends the episode as ``ENV`` instead of raising into TRL.
    """

    _entry: Any
    _tasks: Mapping[str, Task]
    _runner: LoopRunner
    _max_turns: int
    _env_timeout_s: float | None

    def __init__(self) -> None:
        self._driver: EpisodeDriver | None = None
        self._calls = 0
        self.reward: float | None = None
        """The environment's reward once the episode ended (else None)."""
        self.ending: Episode | None = None
        """The episode's record once it has ended (how: its ``truncation_cause``, ``error``)."""
        self.done = False

    def reset(self, **row: Any) -> None:
        """Start an episode of the row's task (the prompt is already in the row)."""
        task_id = row.get(TASK_ID)
        if task_id not in self._tasks:
            raise InvalidArgumentError(
                f"The row's {TASK_ID!r} ({task_id!r:.80}) names no task of this environment: "
                "build the dataset with llm_gym.integrations.trl.trl_dataset."
            )
        task = self._tasks[task_id]
        self._close()  # an episode TRL left unfinished
        self._driver = EpisodeDriver(
            self._entry.env_factory(),
            action_format=self._entry.action_format,
            max_turns=self._max_turns,
            runner=self._runner,
            env_timeout_s=self._env_timeout_s,
        )
        self._calls, self.reward, self.ending, self.done = 0, None, None, False
        self._driver.start_sync(task)
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call as a step of the episode; its result is the tool message (the
        last one the env added), or a ``tool_error`` line when no episode is running."""
        driver = self._driver
        if driver is None or self.done:
            return "tool_error: no episode is running."
        self._calls += 1
        call = {
            "id": f"trl_{self._calls}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        ending = driver.act_sync(driver.action_format.render_tool_calls([call]))
        tools = [m for m in driver.replies() if m.get("role") == "tool"]
        if ending is not None:
            self._end(ending)
        if tools:
            return str(tools[-1].get("content") or "")
        return "" if ending is None else f"tool_error: the episode ended ({self.ending_cause})."

    @property
    def ending_cause(self) -> str:
        """Why the episode ended (``"terminated"`` when the env ended it), or ``""``."""
        if self.ending is None:
            return ""
        cause = self.ending.truncation_cause
        return "terminated" if cause is None else str(cause)

    def _finish(self, reply: str) -> float:
        """Send the final reply as the episode's last step; return the environment's reward.
        An env that goes on after it is cut there, as the turn limit cuts (``MAX_TURNS``:
        TRL's conversation is over), and concluded where it scores cut episodes."""
        driver = self._driver
        if driver is None and not self.done:
            raise InvalidArgumentError("A final reply before reset(): no episode is running.")
        if not self.done and driver is not None:
            ending = driver.act_sync(reply)
            if ending is None:
                ending = self._runner.run(driver.cut(TruncationCause.MAX_TURNS))
            self._end(ending)
        return float(self.reward or 0.0)

    def _end(self, ending: Episode) -> None:
        self.done, self.ending, self.reward = True, ending, float(ending.reward)
        self._close()

    def _close(self) -> None:
        """Release the finished episode's env (a sandbox, a remote session)."""
        if self._driver is not None and self._driver.env is not None:
            self._driver.close_sync()


def environment_factory(
    env: Any,
    *,
    split: str = "train",
    task_options: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    env_timeout_s: float | None = None,
) -> type:
    """The class ``GRPOTrainer(environment_factory=...)`` instantiates once per rollout.

    Args:
        env: A registered id (``"ToolUseGame-v0"``), its ``EnvEntry``, or an env factory.
        split: The split whose tasks rows may name (``trl_dataset``'s split).
        task_options: Options of the task source (``{"world_seed": 1}`` for ToolUseGame).
        max_turns: Assistant turns (tool calls and the final reply) before the episode ends
            as ``MAX_TURNS`` (None: the env's registered ``max_turns``); keep it above TRL's
            ``max_tool_calling_iterations``.
        env_timeout_s: Seconds each env call may take (None: no limit).

    Returns:
        A class with ``reset(**row)`` and one public method per tool of the environment (its
        spec's name, parameters and descriptions); TRL treats every other public method as a
        tool, so the rest is private (:func:`env_reward` sends the final reply).
    """
    entry = as_env_entry(env)
    tasks = entry.tasks(split, **dict(task_options or {}))
    probe = entry.env_factory()(tasks[0])
    specs = list(probe.tool_specs)
    if not specs:  # an env that learns its tools when an episode starts (a remote one)
        runner = LoopRunner()
        try:
            runner.run(probe.reset(tasks[0]))
            specs = list(probe.tool_specs)
        finally:
            runner.run(probe.close())
    methods = {spec["function"]["name"]: _tool_method(spec) for spec in specs}
    clash = sorted(
        n for n in methods if n.startswith("_") or n in dir(_Episode) or n == "get_reward"
    )
    if clash:
        raise InvalidArgumentError(
            f"Tool name(s) {clash} clash with the episode's own methods or attributes (a tool "
            "name may not start with '_' or be one of them)."
        )
    namespace = {
        **methods,
        "_entry": entry,
        "_tasks": {task_key(t, i): t for i, t in enumerate(tasks)},
        "_runner": LoopRunner(),
        "_max_turns": require_turn_limit(entry.max_turns if max_turns is None else max_turns),
        "_env_timeout_s": env_timeout_s,
        "_specs": specs,
        "__doc__": f"{entry.id} as a TRL environment (one instance per rollout).",
    }
    return type(f"{entry.id.replace('-', '_').replace('/', '_')}_TRL", (_Episode,), namespace)


def trl_dataset(
    env: Any,
    split: str = "train",
    *,
    task_options: Mapping[str, Any] | None = None,
    limit: int | None = None,
) -> Any:
    """The rows TRL trains on: ``prompt`` (the environment's opening messages) and ``task_id``
    (the task :func:`environment_factory`'s ``reset`` starts), as a ``datasets.Dataset``."""
    from datasets import Dataset

    entry = as_env_entry(env)
    tasks = entry.tasks(split, **dict(task_options or {}))[:limit]
    runner = LoopRunner()
    rows = []
    for index, task in enumerate(tasks):
        env = entry.env_factory()(task)
        try:
            opening = runner.run(env.reset(task))
        finally:
            runner.run(env.close())  # a sandbox, a remote session
        prompt = [{"role": m["role"], "content": m.get("content") or ""} for m in opening]
        rows.append({"prompt": prompt, TASK_ID: task_key(task, index)})
    return Dataset.from_list(rows)


def env_reward(completions: Sequence[Any], environments: Sequence[Any], **kwargs: Any) -> list:
    """A TRL reward function: each completion's final reply goes to its environment as the last
    step, and the environment's reward comes back. A completion still calling tools when TRL
    stopped it (its turn limit) gets the environment's reward so far (0 for ToolUseGame)."""
    rewards = []
    for completion, environment in zip(completions, environments, strict=True):
        last = completion[-1] if isinstance(completion, list) and completion else completion
        if isinstance(last, dict):
            reply = "" if last.get("tool_calls") else str(last.get("content") or "")
            still_calling = bool(last.get("tool_calls"))
        else:
            reply, still_calling = str(last), False
        if still_calling:
            rewards.append(float(environment.reward or 0.0))
        else:
            rewards.append(environment._finish(reply))
    return rewards


def our_rendering(
    tokenizer: Any,
    tool_specs: Sequence[Mapping[str, Any]],
    action_format: str = "auto",
    template_tools: str = "fallback",
) -> Any:
    """``tokenizer`` with its ``apply_chat_template`` rendering ``tool_specs`` (ours), in their
    order, wherever TRL passes tool callables with the same names, so TRL's prompts are token for
    token the prompts our loop renders: each conversation (TRL passes one or a batch) goes
    through :func:`llm_gym.policies.chat.template_input`, so control tokens are neutralised as in
    our loop (the template arguments' strings included) and a template that cannot render tools
    gets them as text, written by ``action_format`` (``"auto"``: the one the template teaches,
    else hermes; ``template_tools="require"`` refuses such a template here); the render is
    stopped at the render deadline (:mod:`llm_gym.policies.template_render`). Returns the
    tokenizer (patched in place)."""
    from llm_gym.policies.chat import template_input, untrusted_kwargs
    from llm_gym.policies.template_format import episode_format
    from llm_gym.policies.template_render import (
        DEFAULT_RENDER_DEADLINE_S,
        template_name,
        within_deadline,
    )
    from llm_gym.policies.template_tools import check_template_tools, layout_for

    check_template_tools(template_tools)
    action_format = episode_format(action_format, tokenizer, template_tools=template_tools).name
    layout_for(tokenizer, list(tool_specs), template_tools=template_tools)  # refused here

    specs = {spec["function"]["name"]: dict(spec) for spec in tool_specs}
    original = tokenizer.apply_chat_template
    own = set(inspect.signature(original).parameters)  # the rest reach the template itself

    @functools.wraps(original)
    def apply_chat_template(conversation: Any, *args: Any, tools: Any = None, **kwargs: Any):
        if not tools:
            return original(conversation, *args, tools=tools, **kwargs)
        names = {getattr(t, "__name__", None) for t in tools}
        if not names <= specs.keys():  # not our tools: as TRL asked
            return original(conversation, *args, tools=tools, **kwargs)
        ours = [spec for name, spec in specs.items() if name in names]
        template_kwargs = {k: v for k, v in kwargs.items() if k not in own}
        batched = bool(conversation) and isinstance(conversation[0], list | tuple)
        rendered = []
        for chat in conversation if batched else [conversation]:
            messages, rendered_tools = template_input(
                tokenizer, chat, ours, action_format=action_format, template_tools=template_tools,
                chat_template_kwargs=template_kwargs, raw_assistant=False,
            )  # fmt: skip
            rendered.append(messages)
        kwargs.update(untrusted_kwargs(tokenizer, template_kwargs))
        # every conversation of one call has the same tools: one layout for all of them
        return within_deadline(
            lambda: original(
                rendered if batched else rendered[0], *args, tools=rendered_tools, **kwargs
            ),
            DEFAULT_RENDER_DEADLINE_S * len(rendered),
            f"the chat template of {template_name(tokenizer)}",
        )

    tokenizer.apply_chat_template = apply_chat_template
    return tokenizer
