"""``VerifiersEnv``: one episode of a verifiers 0.4 environment as an llm_gym :class:`Env`.

verifiers owns an episode's control flow (``Env.run``: a plain run of the task, or an
``interaction`` answered turn by turn) and llm_gym's loop owns the model. The adapter runs the
episode's program as a background task and inverts the model calls: each time the rollout needs
a reply, ``reset``/``step`` return the conversation so far, and the next ``step`` hands the
policy's message back in.

* The episode ends when the program does (the rollout stopped: the model replied without tool
  calls in a plain run, the env's ``run`` stopped answering, a ``@vf.stop`` fired, the seat's
  ``max_turns`` was reached). The ending ``StepResult`` is ``truncated`` when verifiers counts
  the trace as truncated (``trace.is_truncated``: a turn or token cap), else ``terminated``.
  A trace verifiers truncates itself (the seat's ``max_turns``, say) is the env's own
  truncation: ``ENV`` for the loop, with verifiers' ``stop_condition`` in the metrics.
* Reward: the trace's reward, verifiers' weighted sum ``sum(score * weight)`` over its
  ``@vf.reward`` s (after ``Env.finalize``, which may record more). Metrics: each reward's
  unweighted score and each ``@vf.metric`` by name (a metric named like a reward becomes
  ``metric/<name>``), ``num_turns`` and ``stop_condition``.
* An episode cut short by llm_gym's loop is scored like a verifiers trace its own limits stop:
  ``max_turns`` stops the trace as ``max_turns``, a context overflow as ``max_input_tokens``,
  and the partial trajectory is scored (:meth:`VerifiersEnv.conclude`). A missed generation
  deadline or a policy error fails the rollout instead (no scoring, reward 0), as a failed
  model call fails a verifiers rollout.
* A rollout that failed (a task hook or reward raised, a second rollout was started, the
  program raised) ends the episode with an error, which the loop records as an ``ENV``
  truncation with its traceback.

The seats (:class:`Seat`, :class:`EpisodeRun`) keep verifiers' API for the program's ``agents``
(``await agents.agent.run(task)``; ``async with agents.agent.interaction(task) as game:
segment = await game.turn(...)``, where a multi-turn environment answers each reply with the
next user turn), and the one rollout they start is a
:class:`~llm_gym.integrations.verifiers.rollout.SeatRollout` whose model is llm_gym's loop.
llm_gym plays exactly one rollout per episode (the policy's conversation); a program that
starts a second one (a second seat, or a second run) ends its episode with a clear error.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from llm_gym.core.env import Env, StepResult
from llm_gym.core.factories import as_task
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.integrations.verifiers.rollout import Ask, SeatRollout, SharedTools

try:
    import verifiers.v1 as vf
    from verifiers.v1.agent import Segment
    from verifiers.v1.dialects import parse_message
    from verifiers.v1.trace import TraceTask
    from verifiers.v1.types import UserMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = ["CUT_STOPS", "EpisodeRun", "Seat", "SeatInteraction", "VerifiersEnv"]


# --- the seats a program drives ----------------------------------------------------------------


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


# --- the episode ---------------------------------------------------------------------------------

CUT_STOPS = {"max_turns": "max_turns", "context_overflow": "max_input_tokens"}
"""The verifiers stop condition of an episode llm_gym's loop cut for a length budget (scored);
any other cut fails the rollout."""


class VerifiersEnv(Env):
    """An episode of a verifiers environment, played one model reply at a time.

    Args:
        source: What the episode comes from: a
            :class:`~llm_gym.integrations.verifiers.VerifiersEnvFactory` (its ``environment``,
            ``agent_config``, ``seat_config``, ``task_type``, ``verifiers_task`` and
            ``prepare``).

    After the episode ends, :attr:`trace` is the scored verifiers trace and :attr:`traces` every
    trace of the episode.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self._run: EpisodeRun | None = None
        self._program: asyncio.Future[None] | None = None
        self._events: asyncio.Queue[tuple[str, BaseException | None]] | None = None
        self._reply: asyncio.Future[Message | None] | None = None
        self._done = self._ended = False
        self._extra: list[Message] = []

    # --- the Env contract ----------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        vf_task = self.source.verifiers_task(as_task(task))
        shared = await self.source.prepare()

        async def shared_tools() -> list[Any]:
            return shared

        self._run = EpisodeRun(self._ask, shared_tools, self.source.task_type)
        self._events, self._reply, self._extra = asyncio.Queue(), None, []
        self._done = self._ended = False
        self._program = asyncio.ensure_future(self._play(vf_task))
        await self._next()
        rollout = self._run.rollout
        self.max_turns = rollout.max_turns if rollout is not None else None
        return self.messages

    async def step(self, message: Message) -> StepResult:
        if self._run is None:
            raise InvalidArgumentError("Call reset(task) before step(message).")
        if self._ended:
            raise InvalidArgumentError("The episode has ended; call reset(task) to start another.")
        if self._done:  # the episode ended before the model spoke (a stop before its first call)
            self._extra.append(dict(message))
            return self._result()
        assert self._reply is not None
        self._reply.set_result(dict(message))
        if await self._next() == "request":
            return StepResult(terminated=False, truncated=False, messages=self.messages)
        return self._result()

    @property
    def tool_specs(self) -> list[ToolSpec]:
        rollout = self.rollout
        if rollout is None or rollout.toolbox is None:
            return []
        return [dict(spec) for spec in rollout.toolbox.specs]

    @property
    def messages(self) -> list[Message]:
        rollout = self.rollout
        opening = list(rollout.public) if rollout is not None else []
        return [*opening, *self._extra]

    async def close(self) -> None:
        program, self._program = self._program, None
        if program is not None and not program.done():
            program.cancel()
            await asyncio.gather(program, return_exceptions=True)

    # --- the runner's extras --------------------------------------------------------------------
    async def conclude(self, cause: str) -> StepResult | None:
        """llm_gym's loop ended the episode (``cause``: ``"max_turns"``, ``"context_overflow"``,
        ``"deadline"``, ``"policy_error"``): refuse the pending model call as verifiers refuses
        one at a limit and let the program finish. The scored step for a length budget; None
        (reward 0) for the others, whose rollout fails unscored."""
        rollout = self.rollout
        if self._run is None or self._done or rollout is None or self._reply is None:
            return None
        if cause in CUT_STOPS:
            rollout.trace.stop(CUT_STOPS[cause])
        else:
            rollout.fail(LlmGymError(f"llm_gym's loop ended the episode: {cause}"))
        try:
            while True:
                if not self._reply.done():
                    self._reply.set_result(None)
                if await self._next() != "request":
                    break
        except Exception:
            if cause in CUT_STOPS:
                raise
            return None
        return self._result() if cause in CUT_STOPS else None

    @property
    def rollout(self) -> SeatRollout | None:
        """The episode's rollout (the one llm_gym plays), once the program started it."""
        return self._run.rollout if self._run is not None else None

    @property
    def trace(self) -> Any:
        """The rollout's verifiers trace (scored once the episode has ended)."""
        rollout = self.rollout
        return rollout.trace if rollout is not None else None

    @property
    def traces(self) -> list[Any]:
        """Every finished trace of the episode, in completion order."""
        return list(self._run.completed) if self._run is not None else []

    # --- internals -----------------------------------------------------------------------------
    async def _ask(self, rollout: SeatRollout) -> Message | None:
        assert self._events is not None
        self._reply = asyncio.get_running_loop().create_future()
        self._events.put_nowait(("request", None))
        return await self._reply

    async def _next(self) -> str:
        """Wait for the program: ``"request"`` (the model's turn) or ``"done"``; its error."""
        assert self._events is not None
        kind, error = await self._events.get()
        if kind != "request":
            self._done = True
        if error is not None:
            raise error
        return kind

    async def _play(self, vf_task: Any) -> None:
        assert self._events is not None and self._run is not None
        try:
            await self._episode(vf_task, self._run)
        except asyncio.CancelledError:
            self._events.put_nowait(("error", LlmGymError("The episode's program was cancelled.")))
            raise
        except BaseException as exc:  # the program failed: its episode ends with the error
            self._events.put_nowait(("error", exc))
        else:
            self._events.put_nowait(("done", None))
        finally:
            rollout = self._run.rollout
            if rollout is not None and not rollout.closed:
                await rollout.abort()

    async def _episode(self, vf_task: Any, run: EpisodeRun) -> None:
        """verifiers' ``Env.run_episode``: ``setup``, ``run`` and ``finalize`` over our seats
        (a bare taskset runs as ``SingleAgentEnv``: its one ``agent`` seat runs the task)."""
        environment = self.source.environment
        if environment is None:
            await Seat("agent", self.source.agent_config, run).run(vf_task)
            return
        agents = run.agents(environment.config, self.source.seat_config)
        name = type(environment).__name__
        await environment.setup(agents)
        await environment.run(vf_task, agents)
        if not run.completed:
            raise LlmGymError(f"{name}.run() ran no agent: every episode must carry one run.")
        episode = vf.Episode(
            env=vf.EnvInfo(id=environment.config.env_id),
            task=TraceTask(
                type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key, hash=vf_task.hash
            ),
            traces=list(run.completed),
        )
        await environment.finalize(vf_task, episode)

    def _result(self) -> StepResult:
        self._ended = True
        rollout = self.rollout
        if rollout is None:
            raise LlmGymError("The verifiers episode ended without a rollout.")
        trace = rollout.trace
        if not trace.ok:
            error = trace.last_error
            detail = f"{error.type}: {error.message}" if error is not None else "no error recorded"
            tail = (error.traceback or "")[-2000:] if error is not None else ""
            raise LlmGymError(
                f"The verifiers rollout failed (stop {trace.stop_condition!r}): {detail}\n{tail}"
            )
        metrics: dict[str, Any] = {
            "num_turns": trace.num_turns,
            "stop_condition": trace.stop_condition or "",
        }
        for name, reward in trace.rewards.items():
            if reward is not None and math.isfinite(reward.score):
                metrics[name] = reward.score
        for name, value in trace.metrics.items():
            if value is not None and math.isfinite(value):
                metrics[f"metric/{name}" if name in metrics else name] = value
        truncated = trace.is_truncated
        return StepResult(
            terminated=not truncated,
            truncated=truncated,
            messages=self.messages,
            reward=trace.reward,
            metrics=metrics,
        )
