"""Agent episodes: your agent's own loop, run against the training endpoint, as episode records.

An agent is a callable ``agent(base_url, task)`` (``async def`` or plain; a plain one runs in a
thread) that talks to an OpenAI-compatible endpoint at ``base_url`` in its own loop, with its
own prompts and tools, and returns

* a reward (an ``int`` or ``float``), or
* a final answer (a ``str``) that a ``scorer(task, answer)`` grades, or else the environment:
  a fresh env of the task is reset and given the answer as the assistant's reply, and the step
  that ends it gives the reward.

:func:`run_agent_groups` runs ``episodes_per_task`` episodes of every task concurrently, each
against its own base URL on a :class:`~llm_gym.serving.recording.Recorder`'s server
(``…/episodes/{id}/v1``), and turns each episode's recorded calls into an
:class:`~llm_gym.rollout.episode.Episode`: one :class:`~llm_gym.rollout.episode.Turn` per
call, the recorder's token samples (``env_mask``, logprobs) stamped with the reward, so the
trainer treats it as any other episode (group advantages, overlong shaping, masking).

Whatever the agent does is an episode outcome, never a failure of the collection (run it on
an :class:`AgentLoop`, so that an agent that ignores its cancellation cannot hold the
collection's end either):

* the endpoint refused a call by the episode's rules: truncated as ``MAX_TURNS`` or
  ``CONTEXT_OVERFLOW`` (reward 0; the soft overlong penalty applies), however the agent ended;
* it ran past ``timeout_s``: cancelled, truncated as ``DEADLINE`` (void: it trains nothing);
* it raised, or returned anything but a reward or an answer, or its answer's grading failed:
  truncated as ``ENV`` with the traceback in ``error`` (reward 0).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.actions import ActionFormat, ParseKind
from llm_gym.aio import within
from llm_gym.core.env import TruncationCause, step_outcome
from llm_gym.core.factories import EnvFactory, as_env_factory
from llm_gym.core.task import Task
from llm_gym.core.text import clean_text
from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.episode import Episode, Turn
from llm_gym.serving.recording import RecordedEpisode, Recorder

__all__ = [
    "Agent",
    "AgentLoop",
    "AgentRun",
    "Scorer",
    "check_agent",
    "grade_answer",
    "run_agent_groups",
]

Agent = Callable[[str, Task], Any]
"""``agent(base_url, task) -> reward | final answer`` (``async def`` or plain)."""
Scorer = Callable[[Task, str], Any]
"""``scorer(task, answer) -> reward`` (``async def`` or plain)."""
DEFAULT_AGENT_TIMEOUT_S = 600.0
"""Seconds one agent episode may run."""


def check_agent(agent: object, where: str = "agent") -> Agent:
    """``agent`` when it is callable with ``(base_url, task)``, else an
    :class:`~llm_gym.errors.InvalidArgumentError` that says what is expected."""
    if not callable(agent):
        raise InvalidArgumentError(
            f"{where} must be a callable agent(base_url, task) -> reward or final answer "
            f"(async def or plain), actual value: {agent!r:.80}."
        )
    try:
        inspect.signature(agent).bind("http://127.0.0.1/v1", Task(prompt="p"))
    except TypeError as exc:
        raise InvalidArgumentError(
            f"{where} must take (base_url, task): {exc}; write async def agent(base_url, task)."
        ) from None
    except ValueError:  # a builtin without a signature: called as it is
        pass
    return agent  # type: ignore[return-value]


async def _call(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, awaited when it is async; a plain one runs in a daemon thread of
    its own (one that never returns holds that thread, never the collection's end)."""
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004  (an object with async __call__)
    ):
        return await function(*args)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, failed: bool) -> None:
        if not done.done():
            (done.set_exception if failed else done.set_result)(value)

    def work() -> None:
        try:
            value, failed = function(*args), False
        except BaseException as exc:  # the agent's failure, reported on the loop
            value, failed = exc, True
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, value, failed)

    threading.Thread(target=work, name="llm_gym-agent", daemon=True).start()
    result = await done
    return await result if inspect.isawaitable(result) else result


async def grade_answer(
    env_factory: EnvFactory | Any, task: Task, answer: str
) -> tuple[float, dict[str, Any]]:
    """The reward of ``answer`` to ``task`` by a fresh environment (``env_factory``: a
    ``task -> Env`` factory, an ``Env`` class or a registered id): reset, then the answer as
    the assistant's reply; the step must end the episode (a final answer ends it)."""
    env = as_env_factory(env_factory)(task)
    try:
        await env.reset(task)
        result = await env.step({"role": "assistant", "content": answer})
        if not (result.terminated or result.truncated):
            raise InvalidArgumentError(
                f"{type(env).__name__} did not end the episode on the final answer {answer!r:.80} "
                "(it asked for more: a tool call?); give run_agent_groups a scorer(task, answer)."
            )
        return step_outcome(result, f"{type(env).__name__}.step")
    finally:
        await env.close()


@dataclass(frozen=True)
class AgentRun:
    """How agent episodes run."""

    agent: Agent
    """The user's agent."""
    env_factory: EnvFactory
    """Builds the env that grades a final answer (when no ``scorer`` does)."""
    action_format: ActionFormat
    """The endpoint's action format (the episodes record it)."""
    timeout_s: float | None = DEFAULT_AGENT_TIMEOUT_S
    """Seconds one episode may run (None: no limit)."""
    scorer: Scorer | None = None
    """Grades a final answer (None: the env)."""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _turns(record: RecordedEpisode) -> list[Turn]:
    return [
        Turn(
            text=call.text,
            parse_kind=ParseKind.TOOL_CALLS
            if call.message.get("tool_calls")
            else ParseKind.FINAL_ANSWER,
            message=call.message,
            tool_calls=len(call.message.get("tool_calls") or ()),
            token_ids=list(call.completion_ids),
            logprobs=list(call.logprobs),
            policy_versions=call.policy_versions,
            finish_reason="length" if call.finish_reason == "length" else "stop",
        )
        for call in record.calls
    ]


async def _outcome(
    run: AgentRun, task: Task, result: object
) -> tuple[float, dict[str, Any], TruncationCause | None, str | None]:
    """The reward, metrics, truncation cause and error of what the agent returned."""
    number = _number(result)
    if number is not None:
        return number, {}, None, None
    if not isinstance(result, str):
        error = (
            f"the agent returned {type(result).__name__} {result!r:.80}; expected a reward (a "
            "finite int or float) or a final answer (a str)"
        )
        return 0.0, {}, TruncationCause.ENV, error
    try:
        if run.scorer is not None:
            reward = _number(await _call(run.scorer, task, result))
            if reward is None:
                raise InvalidArgumentError("the scorer must return a finite int or float.")
            return reward, {}, None, None
        reward, metrics = await grade_answer(run.env_factory, task, result)
        return reward, metrics, None, None
    except Exception:
        return 0.0, {}, TruncationCause.ENV, clean_text(traceback.format_exc())


async def _episode(
    run: AgentRun, recorder: Recorder, base_url: str, task: Task, group: int, index: int, key: str
) -> Episode:
    episode_id = f"{key}.{group}.{index}"
    recorder.open(episode_id)
    start = time.perf_counter()
    cause: TruncationCause | None = None
    error: str | None = None
    result: object = None
    try:
        agent_call = _call(run.agent, f"{base_url}/episodes/{episode_id}/v1", task)
        result = await within(agent_call, run.timeout_s, TimeoutError)  # also if it ignores
    except TimeoutError:  # its cancellation
        cause, error = TruncationCause.DEADLINE, f"the agent ran past {run.timeout_s:g} s"
    except asyncio.CancelledError:
        recorder.close(episode_id)
        raise
    except Exception:
        cause, error = TruncationCause.ENV, clean_text(traceback.format_exc())
    record = recorder.close(episode_id)
    reward, metrics = 0.0, {}
    if record.truncation is not None:  # the endpoint's rules ended it, whatever came back
        cause = record.truncation
    elif cause is None:
        reward, metrics, cause, error = await _outcome(run, task, result)
    first = record.calls[0] if record.calls else None
    return Episode(
        task=task,
        group=group,
        index=index,
        messages=record.messages,
        turns=_turns(record),
        reward=reward,
        terminated=cause is None,
        truncated=cause is not None,
        truncation_cause=cause,
        metrics={**metrics, "agent_calls": len(record.calls), "agent_refused": record.refused},
        tool_specs=record.tool_specs,
        num_opening_messages=len(first.messages) if first else 0,
        error=error,
        prompt_tokens=len(first.prompt_ids) if first else 0,
        completion_tokens=sum(len(c.completion_ids) for c in record.calls),
        wall_time_s=time.perf_counter() - start,
        samples=record.samples,
        action_format=run.action_format,
        overflow_tokens=record.overflow_tokens,
    )


async def run_agent_groups(
    run: AgentRun,
    recorder: Recorder,
    base_url: str,
    tasks: Sequence[Task],
    *,
    episodes_per_task: int,
    key: str,
    sequential: bool = False,
) -> list[list[Episode]]:
    """``groups[i][j]``: episode ``j`` of ``tasks[i]``, played by ``run.agent`` against
    ``recorder``'s server at ``base_url`` (``http://HOST:PORT``); ``key`` tells this
    collection's episode ids apart (``{key}.{group}.{index}``). All episodes run concurrently,
    or one at a time with ``sequential``."""
    if sequential:
        return [
            [
                await _episode(run, recorder, base_url, task, g, i, key)
                for i in range(episodes_per_task)
            ]
            for g, task in enumerate(tasks)
        ]

    async def group(g: int, task: Task) -> list[Episode]:
        return list(
            await asyncio.gather(
                *(
                    _episode(run, recorder, base_url, task, g, i, key)
                    for i in range(episodes_per_task)
                )
            )
        )

    return list(await asyncio.gather(*(group(g, t) for g, t in enumerate(tasks))))


class AgentLoop:
    """An event loop on a daemon thread of its own, where agent episodes run: an agent that
    ignores its cancellation past its time limit is left running there, and the collection
    returns (``asyncio.run`` would wait for it as it closes its loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="llm_gym-agents", daemon=True
        )
        self.thread.start()

    def run(self, coro: Any) -> Any:
        """``coro``'s result, run on the loop (call it from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop (what still runs on it is dropped with the thread)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
