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
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from llm_gym.core.env import Env, StepResult
from llm_gym.core.factories import as_task
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.integrations.verifiers_agents import EpisodeRun, Seat
from llm_gym.integrations.verifiers_rollout import SeatRollout

try:
    import verifiers.v1 as vf
    from verifiers.v1.trace import TraceTask
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = ["CUT_STOPS", "VerifiersEnv"]

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
