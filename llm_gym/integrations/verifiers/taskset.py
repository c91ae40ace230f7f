"""llm_gym environments as verifiers 0.4 tasksets and environments.

:class:`LlmGymTaskset` is a ``vf.Taskset`` over any registered llm_gym environment, built the
way a verifiers environment package is: its tasks carry our :class:`~llm_gym.core.Task`
(``LlmGymTaskData.task``) and the env's opening messages (``system_prompt``, ``prompt``);
:class:`LlmGymToolset` serves the env's tools under their own names (an env per rollout, stepped
by each call, closed with the rollout's tool server); the ``env_reward`` reward replays the
trace's assistant turns through a fresh env and returns the env's own reward (0 when the replay
does not end the episode)::

    import verifiers.v1 as vf
    from llm_gym.integrations.verifiers import load_environment, trace_from_messages

    env = load_environment("ToolUseGame-v0", split="val")   # a vf.Env, from vf.load_environment
    task = next(iter(env.taskset))
    trace = trace_from_messages(task, transcript)            # an llm_gym transcript
    await task.score(trace)                                  # trace.rewards["env_reward"]

verifiers' loaders resolve a taskset by importing a top-level module named after its id; this
module registers itself under :data:`TASKSET_ID` in ``sys.modules`` when imported, so
``vf.load_environment(vf.resolve_env_config({"taskset": {"id": "llm_gym_verifiers",
"env_id": ...}}))`` works in any process that imported llm_gym's verifiers integration.

What does not run offline: verifiers' own rollout (``Agent.run``, ``vf eval``) starts its
harness program with ``uv sync --script`` in a runtime, which downloads the program's
dependencies; llm_gym's loop plays the rollout instead (:func:`from_verifiers` on the result).
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from llm_gym.actions import get_action_format
from llm_gym.aio import run_sync
from llm_gym.core.env import step_within_cap
from llm_gym.core.registry import env_entry
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.verifiers.rollout import MODEL_NAME, to_message

try:
    import verifiers.v1 as vf
    from pydantic import Field
    from verifiers.v1 import graph
    from verifiers.v1.dialects import parse_message
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import Response
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "TASKSET_ID",
    "LlmGymTask",
    "LlmGymTaskData",
    "LlmGymTaskset",
    "LlmGymTasksetConfig",
    "LlmGymToolset",
    "llm_gym_taskset",
    "load_environment",
    "trace_from_messages",
]

TASKSET_ID = "llm_gym_verifiers"
"""The taskset id verifiers' loaders resolve to :class:`LlmGymTaskset`."""
JSON_TYPES: dict[str, Any] = {
    "string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict,
}  # fmt: skip


class LlmGymTasksetConfig(vf.TasksetConfig):
    """Which llm_gym tasks load (``--env.taskset.*``)."""

    env_id: str = "ToolUseGame-v0"
    """The registered llm_gym environment."""
    split: str = "train"
    """``train``, ``val`` or ``test``."""
    limit: int | None = None
    """The first ``limit`` tasks of the split (None: all)."""
    task_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the env's task source (ToolUseGame's ``world_seed``, say)."""


class LlmGymTaskData(vf.TaskData):
    """An llm_gym task, with its env's opening messages as ``system_prompt``/``prompt``."""

    env_id: str
    """The registered llm_gym environment."""
    task: dict[str, Any]
    """The llm_gym :class:`Task` (``Task.to_dict()``)."""


async def replay(data: LlmGymTaskData, messages: Sequence[Message]) -> Any:
    """Step a fresh env of ``data`` through the assistant ``messages``; the last StepResult
    (None when there were none), stopping where the episode ends."""
    entry = env_entry(data.env_id)
    task = Task.from_dict(data.task)
    env = entry.env_factory()(task)
    render = get_action_format(entry.action_format).render_message
    result = None
    try:
        await env.reset(task)
        for turn, message in enumerate(messages, 1):
            if getattr(env, "raw_text_actions", False):
                message = {"role": "assistant", "content": render(message)}
            result = await step_within_cap(env, message, turn)
            if result.terminated or result.truncated:
                break
    finally:
        await env.close()
    return result


def tool_function(name: str, spec: ToolSpec, call: Callable[..., Any]) -> Callable[..., Any]:
    """An async function named ``name`` whose signature follows the tool's JSON schema (so an
    MCP server advertises and validates it), calling ``call(name, arguments)``."""
    schema = spec["function"].get("parameters") or {}
    required = set(schema.get("required") or [])
    parameters, annotations = [], {}
    for argument, argument_schema in (schema.get("properties") or {}).items():
        if not argument.isidentifier():
            raise InvalidArgumentError(
                f"Tool {name!r}: argument {argument!r} is not a Python identifier (MCP tools "
                "are Python functions)."
            )
        kind: Any = JSON_TYPES.get(str(argument_schema.get("type")), Any)
        if argument not in required:
            kind = kind | None if kind is not Any else Any
        described = Annotated[kind, Field(description=argument_schema.get("description"))]
        annotations[argument] = described
        parameters.append(
            inspect.Parameter(
                argument,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if argument in required else None,
                annotation=described,
            )
        )

    async def tool(**arguments: Any) -> str:
        return await call(name, {k: v for k, v in arguments.items() if v is not None})

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = spec["function"].get("description") or ""
    tool.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {**annotations, "return": str}
    return tool


class LlmGymToolset(vf.Toolset[vf.ToolsetConfig]):
    """The llm_gym env's tools, under their own names (no server prefix), over one env
    instance per rollout: each call steps the env with an assistant message carrying it."""

    TOOL_PREFIX = None

    def __init__(self, config: vf.ToolsetConfig) -> None:
        super().__init__(config)
        self.env: Any = None
        self.specs: list[ToolSpec] = []
        self.ended = False
        self.calls = 0

    async def setup_task(self, task: Any) -> None:
        data = task.data
        ours = Task.from_dict(data.task)
        self.env = env_entry(data.env_id).env_factory()(ours)
        # The server's teardown (its exit stack, as verifiers' own toolsets use it) closes it.
        self._exit_stack.push_async_callback(self.close_env)
        await self.env.reset(ours)
        self.specs = list(self.env.tool_specs)

    async def close_env(self) -> None:
        """Close the rollout's env (a remote session or a sandbox, say); later calls are
        refused."""
        env, self.env = self.env, None
        if env is not None:
            await env.close()

    def register(self, mcp: Any) -> None:
        for spec in self.specs:
            name = spec["function"]["name"]
            mcp.add_tool(
                tool_function(name, spec, self.call),
                name=name,
                description=spec["function"].get("description") or None,
            )

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Step the env with one call of tool ``name``; the tool message's text."""
        if self.env is None or self.ended:
            return "error: the episode has ended; answer in plain text"
        self.calls += 1
        call_id = f"call_{self.calls}"
        function = {"name": name, "arguments": json.dumps(arguments)}
        calls = [{"id": call_id, "type": "function", "function": function}]
        action = {"role": "assistant", "content": "", "tool_calls": calls}
        result = await step_within_cap(self.env, action, self.calls)
        self.ended = bool(result.terminated or result.truncated)
        replies = [m for m in result.messages if m.get("tool_call_id") == call_id]
        return str(replies[-1].get("content") or "") if replies else ""


class LlmGymTask(vf.Task[LlmGymTaskData, vf.State, vf.TaskConfig]):
    """One llm_gym task: the env's tools, and its reward on the replayed trace."""

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[Any]:
        return [LlmGymToolset(vf.ToolsetConfig())]

    @vf.reward
    async def env_reward(self, task: LlmGymTaskData, trace: vf.Trace) -> float:
        """The env's reward for the trace's assistant turns (0 when they do not end it)."""
        result = await replay(task, [to_message(m) for m in trace.assistant_messages])
        if result is None or not (result.terminated or result.truncated):
            return 0.0
        return float(result.reward)


class LlmGymTaskset(vf.Taskset[LlmGymTask, LlmGymTasksetConfig]):
    """The tasks of a registered llm_gym environment (one split), as verifiers tasks."""

    def load(self) -> Any:
        config = self.config
        entry = env_entry(config.env_id)
        tasks = entry.tasks(config.split, **config.task_options)
        for task in tasks[: config.limit] if config.limit is not None else tasks:
            system, prompt = run_sync(opening(entry, task))
            data = LlmGymTaskData(
                env_id=config.env_id, task=task.to_dict(), system_prompt=system, prompt=prompt,
                id=None if task.id is None else str(task.id),
            )  # fmt: skip
            yield LlmGymTask(data, config.task)


async def opening(entry: Any, task: Task) -> tuple[str | None, Any]:
    """The env's opening messages as ``(system_prompt, prompt)``: a leading system message is
    the system prompt; a lone user message is the prompt text, anything else a message list."""
    env = entry.env_factory()(task)
    try:
        messages = list(await env.reset(task))
    finally:
        await env.close()
    system = None
    if messages and messages[0].get("role") == "system":
        system = str(messages.pop(0).get("content") or "")
    if len(messages) == 1 and messages[0].get("role") == "user":
        return system, str(messages[0].get("content") or "")
    return system, [parse_message(dict(m)) for m in messages]


def llm_gym_taskset(
    env_id: str, *, split: str = "train", limit: int | None = None, **task_options: Any
) -> LlmGymTaskset:
    """The :class:`LlmGymTaskset` of a registered env (``task_options`` go to its task source)."""
    env_entry(env_id)  # an unknown id fails here, with the closest registered one
    return LlmGymTaskset(
        LlmGymTasksetConfig(
            id=TASKSET_ID, env_id=env_id, split=split, limit=limit, task_options=task_options
        )
    )


def load_environment(
    env_id: str = "ToolUseGame-v0",
    *,
    split: str = "train",
    limit: int | None = None,
    max_turns: int | None = None,
    **task_options: Any,
) -> Any:
    """A verifiers ``Env`` (``SingleAgentEnv``) over a registered llm_gym environment, built by
    verifiers' own ``vf.load_environment``: its seat plays verifiers' ``null`` harness (a chat
    loop over the env's tools) in a subprocess runtime, capped at ``max_turns`` (default: the
    registered turn limit)."""
    entry = env_entry(env_id)
    config = vf.resolve_env_config(
        {
            "taskset": {"id": TASKSET_ID, "env_id": env_id, "split": split, "limit": limit,
                        "task_options": task_options},
            "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"},
                      "max_turns": max_turns or entry.max_turns},
        }
    )  # fmt: skip
    return vf.load_environment(config)


def trace_from_messages(
    task: Any, messages: Sequence[Message], tools: Sequence[ToolSpec] | None = None
) -> Any:
    """A verifiers trace of ``task`` holding an llm_gym transcript: each assistant message a
    sampled turn, the rest its context (verifiers' scoring reads it like any rollout's)."""
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=AgentInfo(config=vf.AgentConfig()),
    )
    specs = [spec["function"] for spec in tools or []]
    vf_tools = [vf.Tool(name=s["name"], description=s.get("description") or "",
                        parameters=s.get("parameters") or {}) for s in specs]  # fmt: skip
    prompt: list[Any] = []
    for message in messages:
        typed = parse_message(dict(message))
        if message.get("role") == "assistant":
            response = Response(
                id=f"llm_gym-{len(prompt)}", created=0, model=MODEL_NAME, message=typed,
                finish_reason="tool_calls" if typed.tool_calls else "stop",
            )  # fmt: skip
            graph.prepare_turn(trace, prompt, vf_tools).commit(response)
        prompt.append(typed)
    if prompt and not isinstance(prompt[-1], vf.AssistantMessage):
        graph.prepare_turn(trace, prompt, vf_tools).commit_prompt()
    trace.stop("agent_completed")
    return trace


# verifiers' loaders import a taskset by its id: let TASKSET_ID name this module.
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
