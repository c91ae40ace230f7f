"""One episode's failure never loses the others (:mod:`llm_gym.rollout.loop`): a policy that fails
one episode's turn ends that episode as ``POLICY_ERROR``; an environment that raises or hangs past
``env_timeout_s`` ends its own as ``ENV``; the collection fails only when the policy is down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Sequence

import pytest

from llm_gym import Env, Task, TruncationCause
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.eval import summarize_episodes
from llm_gym.policies import (
    Generation,
    Policy,
    PolicyBatchError,
    PolicyError,
    PolicyRequest,
    PolicyStream,
)
from llm_gym.rollout import collect_groups

TASKS = list(get_tasks("val")[:4])


class Picky(Policy):
    """Answers ``12`` (a wrong final answer: the episode terminates); raises for the requests
    whose task is in ``bad``, which fails the whole batched call they are in."""

    def __init__(self, bad: set[str], *, fatal: bool = False) -> None:
        self.bad, self.fatal, self.calls = bad, fatal, []

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        self.calls.append(len(requests))
        for request in requests:
            if request.task.id in self.bad:
                if self.fatal:
                    raise PolicyError("invalid api key", fatal=True)
                raise ConnectionError(f"endpoint refused {request.task.id}")
        return [Generation(text="12") for _ in requests]


def test_a_failing_request_ends_only_its_episode() -> None:
    bad = {TASKS[1].id}
    policy = Picky(bad)
    groups = collect_groups(ToolUseGameEnv, TASKS, policy, episodes_per_task=2, max_turns=2)
    episodes = [e for group in groups for e in group]
    failed = [e for e in episodes if e.truncation_cause is TruncationCause.POLICY_ERROR]
    assert {e.task.id for e in failed} == bad and len(failed) == 2
    for episode in failed:
        assert "endpoint refused" in episode.error and episode.turns == []
        assert episode.reward == 0.0 and episode.truncated
    others = [e for e in episodes if e not in failed]
    assert all(e.terminated and e.error is None for e in others)
    # The wave of 8 failed, then each request went alone: 8 single calls.
    assert policy.calls == [8, 1, 1, 1, 1, 1, 1, 1, 1]
    summary = summarize_episodes(episodes)
    assert summary["policy_error_ratio"] == 0.25 and summary["env_error_ratio"] == 0.0


class KnowsWhich(Policy):
    """Like :class:`Picky`, but says which requests failed (one request per episode, as an HTTP
    backend sends them), so nothing is sent twice."""

    def __init__(self, bad: set[str]) -> None:
        self.bad, self.calls = bad, []

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        self.calls.append(len(requests))
        outcomes = [
            ConnectionResetError("reset by peer")
            if request.task.id in self.bad
            else Generation(text="12")
            for request in requests
        ]
        if any(isinstance(o, BaseException) for o in outcomes):
            raise PolicyBatchError("some requests failed", outcomes)
        return outcomes  # type: ignore[return-value]


def test_a_backend_that_names_the_failed_requests_is_not_asked_twice() -> None:
    policy = KnowsWhich({TASKS[2].id})
    groups = collect_groups(ToolUseGameEnv, TASKS, policy, episodes_per_task=2, max_turns=2)
    assert policy.calls == [8]
    causes = [[e.truncation_cause for e in group] for group in groups]
    assert causes[2] == [TruncationCause.POLICY_ERROR] * 2
    assert causes[0] == causes[1] == causes[3] == [None, None]
    assert "reset by peer" in groups[2][0].error


def test_a_policy_that_is_down_fails_the_collection_fast() -> None:
    policy = Picky({t.id for t in TASKS})
    with pytest.raises(PolicyError, match="failed 4 of the 4 episodes.*endpoint refused"):
        collect_groups(ToolUseGameEnv, TASKS, policy, max_turns=2)
    assert policy.calls == [4, 1, 1, 1, 1]  # one wave, then each request once


class ResetFails(ToolUseGameEnv):
    async def reset(self, task):
        if task.id == TASKS[0].id:
            raise RuntimeError("no such database")
        return await super().reset(task)


def test_a_policy_that_answered_nothing_fails_the_collection() -> None:
    """One episode never reached the policy (its reset raised); the only request failed."""
    policy = Picky({TASKS[1].id})
    with pytest.raises(PolicyError, match="failed 1 of the 2 episodes.*answered 0 turns"):
        collect_groups(ResetFails, TASKS[:2], policy, max_turns=2)


def test_a_fatal_policy_error_stops_at_once() -> None:
    policy = Picky({TASKS[0].id}, fatal=True)
    with pytest.raises(PolicyError, match="invalid api key") as caught:
        collect_groups(ToolUseGameEnv, TASKS, policy, max_turns=2)
    assert caught.value.fatal and policy.calls == [4]  # no second try


def test_a_policy_error_after_a_good_turn_is_recorded() -> None:
    class SecondTurnFails(Policy):
        async def act(self, requests):
            if any(m["role"] == "tool" for r in requests for m in r.messages):
                raise TimeoutError("read timed out")
            return [Generation(text='<tool_call>{"name": "list_fact_keys"}</tool_call>')] * len(
                requests
            )

    class Mixed(Policy):
        """Task 0's episode fails at its second turn; the others answer at once."""

        def __init__(self) -> None:
            self.inner = SecondTurnFails()

        async def act(self, requests):
            if len(requests) > 1:
                raise RuntimeError("batch failed")  # forces one call per request
            if requests[0].task.id == TASKS[0].id:
                return await self.inner.act(requests)
            return [Generation(text="12")]

    groups = collect_groups(ToolUseGameEnv, TASKS[:2], Mixed(), max_turns=4)
    first, second = groups[0][0], groups[1][0]
    assert first.truncation_cause is TruncationCause.POLICY_ERROR
    assert first.num_turns == 1 and "read timed out" in first.error
    assert first.messages[-1]["role"] == "tool"  # the env's reply to the good turn is kept
    assert second.terminated


class BrokenStream(PolicyStream):
    """A continuous-batching stream that fails the turns of one episode key."""

    def __init__(self, bad_key: Hashable) -> None:
        self.bad_key, self.batch_sizes = bad_key, []

    async def act(self, key: Hashable, request: PolicyRequest) -> Generation:
        if key == self.bad_key:
            raise RuntimeError("CUDA error: an illegal memory access")
        return Generation(text="12")

    def release(self, key: Hashable) -> None:
        pass

    async def aclose(self) -> None:
        pass


class Streaming(Policy):
    def __init__(self, bad_key: Hashable) -> None:
        self.bad_key = bad_key

    async def act(self, requests):  # pragma: no cover - the loop uses the stream
        raise AssertionError("not used")

    def open_stream(self) -> PolicyStream:
        return BrokenStream(self.bad_key)


def test_a_stream_failure_ends_only_its_episode() -> None:
    groups = collect_groups(ToolUseGameEnv, TASKS[:2], Streaming((1, 0)), max_turns=2)
    assert groups[0][0].terminated
    assert groups[1][0].truncation_cause is TruncationCause.POLICY_ERROR
    assert "illegal memory access" in groups[1][0].error


# --- environments that raise or hang ----------------------------------------------------------


class Hangs(ToolUseGameEnv):
    """Hangs in the call named by the task's metadata (``reset``, ``step`` or ``close``)."""

    async def reset(self, task):
        if task.metadata.get("hang") == "reset":
            await asyncio.sleep(3600)
        return await super().reset(task)

    async def step(self, message):
        if self.task.metadata.get("hang") == "step":
            await asyncio.sleep(3600)
        return await super().step(message)

    async def close(self):
        if self._task is not None and self._task.metadata.get("hang") == "close":
            await asyncio.sleep(3600)
        await super().close()


def _with(task: Task, **metadata) -> Task:
    return Task(task.prompt, task.target, {**task.metadata, **metadata}, id=task.id)


def test_a_hanging_env_holds_only_its_own_episode_for_env_timeout_s() -> None:
    tasks = [_with(TASKS[0], hang="step"), _with(TASKS[1], hang="reset"), TASKS[2], TASKS[3]]
    tasks.append(_with(TASKS[3], hang="close"))
    started = time.perf_counter()
    groups = collect_groups(
        Hangs, tasks, Picky(set()), episodes_per_task=2, max_turns=2, env_timeout_s=0.5
    )
    took = time.perf_counter() - started
    assert took < 5, f"the collection took {took:.1f} s"  # bounded: a few timeouts, not an hour
    by_hang = {}
    for group, task in zip(groups, tasks, strict=True):
        by_hang[task.metadata.get("hang")] = group
    for episode in by_hang["step"] + by_hang["reset"]:
        assert episode.truncation_cause is TruncationCause.ENV
        assert "did not return within env_timeout_s=0.5 s" in episode.error
    for episode in by_hang[None]:
        assert episode.terminated and episode.error is None
    for episode in by_hang["close"]:  # ended well; the close that hung is recorded
        assert episode.terminated and "Hangs.close did not return" in episode.error


def test_env_timeout_is_checked() -> None:
    from llm_gym.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="env_timeout_s"):
        collect_groups(ToolUseGameEnv, TASKS[:1], Picky(set()), max_turns=2, env_timeout_s=0)


class RaisesOnStep(Env):
    async def reset(self, task):
        return [{"role": "user", "content": task.prompt}]

    async def step(self, message):
        raise OSError("disk full \udcff")

    tool_specs = []  # type: ignore[assignment]
    messages = []  # type: ignore[assignment]


def test_an_env_error_is_recorded_as_valid_text() -> None:
    [[episode]] = collect_groups(RaisesOnStep, [Task("x")], Picky(set()), max_turns=2)
    assert episode.truncation_cause is TruncationCause.ENV
    assert "disk full \ufffd" in episode.error
    episode.error.encode("utf-8")


def test_the_trainer_logs_the_policy_error_ratio() -> None:
    pytest.importorskip("trl")
    from trainers.grpo.metrics import EPISODE_KEYS

    assert "policy_error_ratio" in EPISODE_KEYS and "deadline_ratio" in EPISODE_KEYS
