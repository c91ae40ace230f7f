"""The agents a verifiers ``Env.run`` program drives, played by llm_gym's loop.

A verifiers 0.4 environment is a taskset plus an ``Env`` whose ``run(task, agents)`` says how
one task becomes one episode: ``SingleAgentEnv`` runs its ``agent`` seat on the task, and a
multi-turn environment holds an ``interaction`` open and answers each reply with the next user
turn (its environment response: a game engine, a scripted user, feedback). The seats here keep
verifiers' API (``await agents.agent.run(task)``, ``async with agents.agent.interaction(task)
as game: segment = await game.turn(...)``), and the one rollout they start is a
:class:`~llm_gym.integrations.verifiers_rollout.SeatRollout` whose model is llm_gym's loop.

llm_gym plays exactly one rollout per episode (the policy's conversation); a program that
starts a second one (a second seat, or a second run) ends its episode with a clear error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.verifiers_rollout import Ask, SeatRollout, SharedTools

try:
    import verifiers.v1 as vf
    from verifiers.v1.agent import Segment
    from verifiers.v1.dialects import parse_message
    from verifiers.v1.types import UserMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = ["EpisodeRun", "Seat", "SeatInteraction"]


class SeatInteraction:
    """A rollout held open turn by turn (verifiers' ``Interaction``): ``turn(message)`` sends
    one user turn and runs one segment; a prompted task's opening reply is a bare ``turn()``."""

    def __init__(self, rollout: SeatRollout) -> None:
        self._run = rollout
        self._over = self._started = False

    @property
    def trace(self) -> Any:
        return self._run.trace

    async def turn(self, message: str | Sequence[Any] | None = None) -> Any:
        """One user turn and one segment; a ``terminated`` segment when the run ended."""
        if self._run.closed:
            raise RuntimeError("this interaction is closed")
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        prompted = not self._started and self.trace.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError(
                "nothing to run a turn on: a bare turn() takes a prompted task's opening reply; "
                "this exchange takes its next user message"
            )
        if message is not None and prompted:
            raise ValueError(
                "the task's prompt opens this exchange: take its first reply with a bare turn() "
                "before answering"
            )
        messages = None
        if isinstance(message, str):
            messages = [UserMessage(content=message)]
        elif message is not None:
            messages = [parse_message(m) if isinstance(m, dict) else m for m in message]
        self._started = True
        trace = self.trace
        turns_before, nodes_before = trace.num_turns, len(trace.nodes)
        await self._run.step(messages)
        if trace.num_turns > turns_before:
            segment: list[Any] = []
            saw_assistant = False
            for node in trace.nodes[nodes_before:]:
                if node.sampled:
                    segment.append(node.message)
                    saw_assistant = True
                elif saw_assistant and isinstance(node.message, vf.ToolMessage):
                    segment.append(node.message)
            return Segment(messages=segment, root_reply=trace.root_reply)
        self._over = True
        return Segment(messages=[], terminated=True)

    async def send(self, message: str, **kwargs: Any) -> dict:
        raise InvalidArgumentError(
            "llm_gym plays verifiers interactions turn by turn; send()/steer() (delivery into a "
            "running turn) is not supported: use turn(message)."
        )

    steer = send

    async def close(self) -> Any:
        """End the exchange (``user_closed``) and finish the rollout; the trace."""
        if not self._run.closed and self._run.ok:
            self.trace.stop("user_closed")
        return await self._run.close()


class Seat:
    """One agent seat of an episode, as ``Env.run`` sees it (``agents.<name>``)."""

    def __init__(self, name: str, config: Any, episode: EpisodeRun) -> None:
        self.name = name
        self.config = config
        self.trainable = True
        self._episode = episode

    async def run(self, task: Any, *, runtime: Any = None, tools: Any = None,
                  on_trace: Any = None, collect_artifacts: bool = False) -> Any:  # fmt: skip
        """Run the task to the end (one segment), then finalize and score; the trace."""
        rollout = self._episode.new_rollout(self, task, False, runtime, on_trace)
        try:
            if await rollout.open():
                await rollout.step()
                if rollout.ok:
                    rollout.trace.stop("agent_completed")
            trace = await rollout.close()
        except BaseException:
            await rollout.abort()
            raise
        self._episode.completed.append(trace)
        return trace

    @asynccontextmanager
    async def interaction(self, task: Any, *, runtime: Any = None, tools: Any = None,
                          on_trace: Any = None) -> AsyncIterator[SeatInteraction]:  # fmt: skip
        """The rollout held open turn by turn; leaving the context closes and scores it."""
        rollout = self._episode.new_rollout(self, task, True, runtime, on_trace)
        interaction = SeatInteraction(rollout)
        if not await rollout.open() and rollout.failure is not None:
            self._episode.completed.append(await rollout.close())
            raise rollout.failure
        try:
            yield interaction
        except Exception as exc:
            rollout.fail(exc)
            raise
        except BaseException:
            await rollout.abort()
            raise
        finally:
            trace = rollout.trace if rollout.closed else await interaction.close()
            if trace.is_completed:  # an aborted rollout (cancellation) joins no episode
                self._episode.completed.append(trace)


class EpisodeRun:
    """One episode's program state: its seats, the one rollout llm_gym plays, the traces.

    Args:
        ask: Where the rollout's model calls go.
        shared_tools: The taskset's shared tool servers.
        task_type: The taskset's task class (only its tasks get the shared tools).
    """

    def __init__(self, ask: Ask, shared_tools: SharedTools, task_type: type) -> None:
        self.ask = ask
        self.shared_tools = shared_tools
        self.task_type = task_type
        self.rollout: SeatRollout | None = None
        self.completed: list[Any] = []
        """Every finished trace, in completion order (the episode's traces)."""

    def agents(self, config: Any, adjust: Callable[[Any], Any] | None = None) -> Any:
        """The seats of an env config (each ``AgentConfig`` field, passed through ``adjust``),
        as verifiers' ``Agents``."""
        adjust = adjust or (lambda spec: spec)
        return vf.Agents(config, lambda name, spec: Seat(name, adjust(spec), self))

    def new_rollout(
        self, seat: Seat, task: Any, has_user: bool, runtime: Any, on_trace: Any
    ) -> SeatRollout:
        """The episode's rollout, for ``seat`` on ``task``; the only one it may start."""
        if runtime is not None:
            raise InvalidArgumentError(
                "llm_gym runs verifiers rollouts in-process; a borrowed runtime (runtime=...) "
                "is not supported."
            )
        if self.rollout is not None:
            raise InvalidArgumentError(
                f"llm_gym's loop plays one agent rollout per episode; seat {seat.name!r} started "
                f"a second one (the first was seat {self.rollout.trace.agent.name!r})."
            )
        shared = self.shared_tools if isinstance(task, self.task_type) else None
        self.rollout = rollout = SeatRollout(
            task, config=seat.config, name=seat.name, trainable=seat.trainable,
            has_user=has_user, ask=self.ask, shared_tools=shared,
        )  # fmt: skip
        if on_trace is not None:
            on_trace(rollout.trace)
        return rollout
