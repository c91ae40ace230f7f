"""One agent's rollout of a verifiers task, with llm_gym's loop as the model.

verifiers 0.4 runs a rollout as a harness program (its ``null`` harness: a chat loop over the
task's MCP tools) whose model calls pass through an interception server that applies the task's
hooks and records each turn on a :class:`~verifiers.v1.Trace`. :class:`SeatRollout` does the
same work in-process, one model call at a time, and asks llm_gym's loop for each reply instead
of calling a model:

* Before each model call, the framework's limits (``max_turns``) and the task's ``@vf.stop``
  hooks on the trace and the request run, then its request ``@vf.intercept`` ors (through
  verifiers' own :class:`~verifiers.v1.session.RolloutSession`); a stop ends the rollout there.
* The reply is committed to the trace as a sampled turn (verifiers' message graph); response
  interceptors and stops run on it, then the request hooks on each proposed tool call.
* Tool calls run as the chat harness runs them (:mod:`~llm_gym.integrations.verifiers.tools`);
  a reply without tool calls ends the segment, as it ends the chat program.
* Closing the rollout runs the task's ``finalize`` and its scoring (``Task.score``: the
  ``@vf.reward`` and ``@vf.metric`` methods), both without a runtime (no sandbox exists here).

The agents an ``Env.run`` program drives are in :mod:`~llm_gym.integrations.verifiers.env`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from llm_gym.core.types import Message
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.verifiers.tools import ToolBox, ToolServer

try:
    import verifiers.v1 as vf
    from verifiers.v1 import graph
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.dialects import parse_message
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.harnesses.utils.compaction import bound_tool_message
    from verifiers.v1.session import RolloutLimits, RolloutSession, hook_boundary
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import Request, Response, UserMessage, content_text
    from verifiers.v1.utils.decorators import discover_decorated, invoke
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = ["MODEL_NAME", "Ask", "SeatRollout", "SharedTools", "to_message"]

MODEL_NAME = "llm_gym"
"""The model name recorded on the trace's responses (the policy is llm_gym's)."""

Ask = Callable[["SeatRollout"], Awaitable[Message | None]]
"""Asks llm_gym's loop for the next assistant message; None when the loop ended the episode."""
SharedTools = Callable[[], Awaitable[list[ToolServer]]]
"""The taskset's shared tool servers, started once."""


def to_message(message: Any) -> Message:
    """A verifiers message as an llm_gym (OpenAI chat) message, content as text."""
    wire = message_to_wire(message)
    out: Message = {"role": wire["role"], "content": content_text(message.content)}
    for key in ("tool_calls", "tool_call_id", "name"):
        if wire.get(key):
            out[key] = wire[key]
    return out


class SeatRollout:
    """One rollout of ``task`` (verifiers' ``Rollout`` and ``null`` harness, in-process).

    Args:
        task: The verifiers task.
        config: The seat's ``AgentConfig`` (its ``max_turns`` and token caps are the limits).
        name: The seat's name (stamped on the trace).
        trainable: Whether the seat's tokens train the policy (stamped on the trace).
        has_user: The caller supplies user turns (an ``interaction``), so a prompt-less task is
            allowed.
        ask: Where each model call goes.
        shared_tools: The taskset's shared tool servers (None: the task is not the taskset's).
    """

    def __init__(
        self,
        task: Any,
        *,
        config: Any,
        name: str,
        trainable: bool,
        has_user: bool,
        ask: Ask,
        shared_tools: SharedTools | None,
    ) -> None:
        self.task = task
        self.ask = ask
        self.has_user = has_user
        self.shared_tools = shared_tools
        self.trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=AgentInfo(config=config, name=name, trainable=trainable),
        )
        stops = [(hook_boundary(fn, allow_trace=True), fn) for fn in task.hooks("stop")]
        hooks = [
            (hook_boundary(fn, allow_trace=False), fn)
            for fn in discover_decorated(task, "intercept")
        ]
        self.session = RolloutSession(
            ctx=ModelContext(model=MODEL_NAME, client=EvalClientConfig()),
            trace=self.trace,
            trace_stops=[fn for kind, fn in stops if kind is vf.Trace],
            limits=RolloutLimits(
                max_turns=config.max_turns,
                max_input_tokens=config.max_input_tokens,
                max_output_tokens=config.max_output_tokens,
                max_total_tokens=config.max_total_tokens,
            ),
            request_interceptors=[fn for kind, fn in hooks if kind is Request],
            response_interceptors=[fn for kind, fn in hooks if kind is Response],
            request_stops=[fn for kind, fn in stops if kind is Request],
            response_stops=[fn for kind, fn in stops if kind is Response],
            gates_tools=True,
        )
        self.conversation: list[Any] = []
        """What the chat program holds (verifiers messages)."""
        self.public: list[Message] = []
        """The same conversation as llm_gym messages (what the policy sees)."""
        self.toolbox: ToolBox | None = None
        self.opened = self.closed = self.failed = False
        self.failure: Exception | None = None

    # --- state --------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """Whether the exchange can continue: nothing failed, nothing stopped it."""
        return not self.failed and self.trace.stop_condition is None

    @property
    def max_turns(self) -> int | None:
        """The seat's turn limit (verifiers' ``max_turns``), if any."""
        return self.session.limits.max_turns

    def fail(self, error: Exception) -> None:
        """Record ``error`` as the rollout's outcome (no scoring follows)."""
        self.failed, self.failure = True, error
        self.trace.record_error(error)

    # --- lifecycle ----------------------------------------------------------------------------
    async def open(self) -> bool:
        """Task setup, the tool servers, the opening conversation; whether it can proceed."""
        self.opened = True
        task, session = self.task, self.session
        try:
            if task.data.prompt is None and not self.has_user:
                raise vf.TaskError(
                    "task has no prompt and no user to open the conversation; set task.prompt, "
                    "or drive the run through agent.interaction() and open it with turn(message)"
                )
            await self._hook("setup")
            owned = [ToolServer(toolset) for toolset in task.toolsets(task.config)]
            for server in owned:
                await server.start(task)
            shared = await self.shared_tools() if self.shared_tools is not None else []
            self.toolbox = ToolBox(owned, shared)
            opening: list[Any] = []
            if task.data.system_prompt:
                opening.append(vf.SystemMessage(content=task.data.system_prompt))
            prompt = task.data.prompt
            if isinstance(prompt, str):
                opening.append(UserMessage(content=prompt))
            elif prompt is not None:
                opening.extend(prompt)
            if session.request_interceptors and prompt is not None:
                prepared, rewrites = await session.prepare_users(Request(messages=opening))
                self.trace.request_rewrites.extend(rewrites)
                opening = list(prepared.messages)
            self._extend(opening)
        except Exception as exc:  # a setup failure is the rollout's outcome
            self.fail(exc)
            return False
        return not session.stopped

    async def step(self, messages: Sequence[Any] | None = None) -> bool:
        """Run one segment (the user's ``messages``, if any, then the chat loop until a reply
        without tool calls); whether the exchange can continue."""
        if not self.opened or self.closed or not self.ok:
            return False
        trace, session = self.trace, self.session
        turns_before, root_before = trace.num_turns, trace.root_reply
        trace.root_reply = None
        try:
            if messages is not None:
                if session.request_interceptors:
                    prepared, rewrites = await session.prepare_users(Request(messages=messages))
                    trace.request_rewrites.extend(rewrites)
                    if session.stopped:
                        return False
                    messages = prepared.messages
                self._extend(messages)
            await self._segment()
        except Exception as exc:  # a hook or tool failure ends the rollout as failed
            self.fail(exc)
            return False
        finally:
            if trace.num_turns == turns_before:
                trace.root_reply = root_before
        return self.ok and trace.num_turns > turns_before

    async def close(self) -> Any:
        """Finish the rollout: tool servers down, then the task's ``finalize`` and scoring
        (skipped when the rollout failed; a stopped one scores its partial trajectory).
        Idempotent; returns the trace."""
        if self.closed:
            return self.trace
        self.closed = True
        trace = self.trace
        try:
            if self.toolbox is not None:
                await self.toolbox.stop()
            if not self.failed and self.opened:
                await self._hook("finalize")
                await self.task.score(trace, None)
        except Exception as exc:  # finalize and scoring failures are the rollout's outcome
            self.fail(exc)
        finally:
            trace.is_completed = True
            trace.ok = not self.failed
        return trace

    async def abort(self) -> None:
        """Free the tool servers without finalizing or scoring (cancellation)."""
        self.closed = True
        if self.toolbox is not None:
            toolbox, self.toolbox = self.toolbox, None
            await toolbox.stop()

    # --- the chat loop (verifiers' null harness) -----------------------------------------------
    async def _segment(self) -> None:
        session = self.session
        gating = bool(session.request_interceptors or session.request_stops)
        while True:
            reply = await self._sample()
            if reply is None or not reply.tool_calls:
                return
            assert self.toolbox is not None
            for call in reply.tool_calls:
                if gating:
                    try:
                        arguments: Any = json.loads(call.arguments or "{}")
                    except json.JSONDecodeError:
                        arguments = call.arguments
                    decision = await session.decide_tool(call.id, call.name, arguments)
                    if decision["action"] == "stop":
                        return
                    if decision["action"] == "deny":
                        self._extend([parse_message(bound_tool_message(decision["message"]))])
                        continue
                result = await self.toolbox.run(call, self.trace)
                self._extend([parse_message(result)])

    async def _sample(self) -> Any:
        """One model call with every hook around it; the committed reply, or None when the
        rollout stopped (a limit, a ``@vf.stop``, or llm_gym's loop ending the episode)."""
        session, trace = self.session, self.trace
        if session.stopped or await session.refused() is not None:
            return None
        assert self.toolbox is not None
        request = Request(messages=list(self.conversation), tools=self.toolbox.tools or None)
        request, rewrites, stopped = await session.rewrite_request(request)
        trace.request_rewrites.extend(rewrites)
        self._take_rewrites(request.messages)
        turn = graph.prepare_turn(trace, request.messages, request.tools)
        if stopped is not None:
            turn.commit_prompt()
            trace.stop(stopped)
            return None
        action = await self.ask(self)
        if action is None or trace.stop_condition is not None:
            turn.abandon()
            return None
        message = parse_message(dict(action))
        response = Response(
            id=f"llm_gym-{uuid.uuid4().hex[:12]}",
            created=int(time.time()),
            model=MODEL_NAME,
            message=message,
            finish_reason="tool_calls" if message.tool_calls else "stop",
        )
        stopped = None
        if session.response_interceptors or session.response_stops:
            response, rewrites, stopped = await session.rewrite_response(response)
            trace.response_rewrites.extend(rewrites)
        node = turn.commit(response)
        session.consume_prepared(turn.tail)
        self.conversation.append(response.message)
        self.public.append(
            dict(action) if response.message is message else to_message(response.message)
        )
        if stopped is None:
            stopped = await session.gate_tool_calls(node)
        if stopped is not None:
            trace.stop(stopped)
            return None
        return response.message

    def _take_rewrites(self, messages: Sequence[Any]) -> None:
        """Keep what the request interceptors rewrote (new user or tool messages, in place)."""
        if len(messages) != len(self.conversation):
            names = ", ".join(fn.__name__ for fn in self.session.request_interceptors) or "none"
            change = len(messages) - len(self.conversation)
            did = (
                f"added {change} message(s) to"
                if change > 0
                else f"removed {-change} message(s) from"
            )
            raise InvalidArgumentError(
                f"A request interceptor (@vf.intercept: {names}) {did} the conversation "
                f"({len(self.conversation)} messages sent, {len(messages)} returned); a "
                "request interceptor may only rewrite new user and tool messages in place."
            )
        for i, (before, after) in enumerate(zip(self.conversation, messages, strict=True)):
            if before != after:
                self.conversation[i], self.public[i] = after, to_message(after)

    def _extend(self, messages: Sequence[Any]) -> None:
        for message in messages:
            self.conversation.append(message)
            self.public.append(to_message(message))

    async def _hook(self, name: str) -> None:
        """Run the task's ``setup``/``finalize`` when it overrides it, with ``runtime=None``."""
        task = self.task
        if getattr(type(task), name) is getattr(vf.Task, name):
            return
        try:
            result = invoke(getattr(task, name), {"trace": self.trace, "runtime": None})
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:
            raise vf.TaskError(
                f"task {type(task).__name__}.{name} failed in-process (llm_gym runs verifiers "
                f"tasks without a runtime, runtime=None): {type(exc).__name__}: {exc}"
            ) from exc
