"""The episode driver: every rule of an episode, through its async and its synchronous face, and
the two callers (``TextEnv`` and ``collect_groups``) reaching the same ends from the same texts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import gymnasium
import pytest

from llm_gym import Env, StepResult, SyncEnv, Task, TruncationCause
from llm_gym.actions import ParseKind
from llm_gym.core.factories import as_env_factory
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym import TextEnv
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import Episode, EpisodeDriver, collect_groups

CALL = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
GARBLED = "<tool_call>{not json</tool_call>"


class PingEnv(Env):
    """Answers ``ping`` calls with a tool message; a plain reply ``"done"`` terminates (reward
    1), ``"stop"`` truncates (reward 0.5), ``"boom"`` raises; ``cap`` sets ``max_turns``."""

    def __init__(self, cap: int | None = None, raw: bool = False) -> None:
        self.max_turns = cap
        self.raw_text_actions = raw  # type: ignore[misc]
        self._messages: list = []

    async def reset(self, task: Task) -> list:
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message) -> StepResult:
        text = message.get("content") or ""
        if text == "boom":
            raise RuntimeError("the env broke")
        self._messages.append(message)
        if message.get("tool_calls") or text == CALL:
            self._messages.append({"role": "tool", "name": "ping", "content": "pong"})
            return StepResult(False, False, list(self._messages))
        if text == "stop":
            return StepResult(False, True, list(self._messages), 0.5, {"why": 1})
        done = text == "done"
        return StepResult(done, False, list(self._messages), float(done), {"answered": 1})

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._messages)


class SyncPing(SyncEnv):
    """PingEnv's rules as a SyncEnv (the driver calls its plain methods)."""

    def __init__(self) -> None:
        self.inner = PingEnv()

    def reset_sync(self, task: Task) -> list:
        return asyncio.run(self.inner.reset(task))

    def step_sync(self, message) -> StepResult:
        return asyncio.run(self.inner.step(message))

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return self.inner.messages


TASK = Task("ping until done")


def ending(episode: Episode | None) -> tuple | None:
    """How ``episode`` ended: ``(reward, terminated, truncation_cause, metrics)``; None while it
    goes on (an act's None)."""
    if episode is None:
        return None
    assert episode.truncated is not episode.terminated  # exactly one of the two
    return episode.reward, episode.terminated, episode.truncation_cause, episode.metrics


def play(driver: EpisodeDriver, texts: Sequence[str], mode: str) -> list[Episode | None]:
    """Start an episode and act with ``texts`` until it ends; the act results."""
    results: list[Episode | None] = []
    if mode == "sync":
        driver.start_sync(TASK)
        for text in texts:
            results.append(driver.act_sync(text))
            if results[-1] is not None:
                break
        driver.close_sync()
        return results

    async def run() -> None:
        await driver.start(TASK)
        for text in texts:
            results.append(await driver.act(text))
            if results[-1] is not None:
                break
        await driver.close()

    asyncio.run(run())
    return results


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def test_terminated_keeps_the_env_reward_and_metrics(mode: str) -> None:
    driver = EpisodeDriver(as_env_factory(PingEnv))
    results = play(driver, [CALL, CALL, "done"], mode)
    assert results[:2] == [None, None]
    assert ending(results[2]) == (1.0, True, None, {"answered": 1})
    assert driver.turn == 3 and driver.replies() == []
    roles = [m["role"] for m in driver.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_env_truncation_is_env_with_its_reward(mode: str) -> None:
    end = play(EpisodeDriver(as_env_factory(PingEnv)), ["stop"], mode)[-1]
    assert ending(end) == (0.5, False, TruncationCause.ENV, {"why": 1})
    assert end.truncated


def test_parse_failure_ends_with_the_reward_and_reason_and_never_reaches_the_env(mode: str) -> None:
    driver = EpisodeDriver(as_env_factory(PingEnv), failed_parse_reward=-0.25)
    end = play(driver, [CALL, GARBLED], mode)[-1]
    assert end is not None and end.reward == -0.25 and not end.terminated
    assert end.truncation_cause is TruncationCause.PARSE_FAILURE
    assert driver.parsed is not None and driver.parsed.kind is ParseKind.PARSE_FAILURE
    assert driver.parsed.error
    assert driver.messages[-1] == driver.action and driver.replies() == []
    assert sum(m["role"] == "assistant" for m in driver.messages) == 2


def test_raw_text_envs_get_the_text_and_never_fail_to_parse(mode: str) -> None:
    driver = EpisodeDriver(lambda task: PingEnv(raw=True), record_parse=True)
    results = play(driver, [GARBLED, "done"], mode)
    assert [ending(r) for r in results] == [None, (1.0, True, None, {"answered": 1})]
    assert driver.action == {"role": "assistant", "content": "done"}
    assert driver.parsed is not None and driver.parsed.kind is ParseKind.FINAL_ANSWER
    unrecorded = EpisodeDriver(lambda task: PingEnv(raw=True))
    play(unrecorded, ["x"], mode)
    assert unrecorded.parsed is None


def test_turn_limit_is_the_smaller_of_the_run_and_the_env_cap(mode: str) -> None:
    end = play(EpisodeDriver(as_env_factory(PingEnv), max_turns=3), [CALL] * 9, mode)
    assert len(end) == 3 and ending(end[-1]) == (0.0, False, TruncationCause.MAX_TURNS, {})
    capped = play(EpisodeDriver(lambda task: PingEnv(cap=2), max_turns=9), [CALL] * 9, mode)
    assert len(capped) == 2 and capped[-1].truncation_cause is TruncationCause.MAX_TURNS
    # an env cap of 5 no longer overrides a run's max_turns=2
    run_capped = play(EpisodeDriver(lambda task: PingEnv(cap=5), max_turns=2), [CALL] * 9, mode)
    assert len(run_capped) == 2 and run_capped[-1].truncation_cause is TruncationCause.MAX_TURNS


def test_a_step_that_raises_is_an_env_truncation_with_the_traceback(mode: str) -> None:
    driver = EpisodeDriver(as_env_factory(PingEnv))
    end = play(driver, [CALL, "boom"], mode)[-1]
    assert end is not None and end.truncation_cause is TruncationCause.ENV and end.reward == 0.0
    assert "the env broke" in (end.error or "")
    assert driver.messages[-1] == {"role": "assistant", "content": "boom"}


def test_the_caller_ends_an_episode_and_acting_after_the_end_is_refused() -> None:
    driver = EpisodeDriver(as_env_factory(PingEnv))
    driver.start_sync(TASK)
    end = driver.end(TruncationCause.CONTEXT_OVERFLOW)
    assert ending(end) == (0.0, False, TruncationCause.CONTEXT_OVERFLOW, {})
    assert end is driver.episode and driver.ended
    with pytest.raises(InvalidArgumentError, match="start"):
        driver.act_sync("done")
    driver.close_sync()
    driver.close_sync()  # twice is fine
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        EpisodeDriver(as_env_factory(PingEnv), max_turns=0)


def test_a_sync_env_runs_without_an_event_loop() -> None:
    driver = EpisodeDriver(as_env_factory(SyncPing))
    end = play(driver, [CALL, "done"], "sync")[-1]
    assert ending(end) == (1.0, True, None, {"answered": 1})
    assert driver.runner is None or not driver.runner.has_loop  # never needed one


class Texts(Policy):
    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        turns = [sum(m["role"] == "assistant" for m in r.messages) for r in requests]
        return [Generation(text=self.texts[t]) for t in turns]


@pytest.mark.parametrize(
    "texts",
    [[CALL, "done"], [CALL, GARBLED], [CALL, "stop"], [CALL, "boom"], [CALL] * 5, ["done"]],
)
def test_text_env_and_the_loop_reach_the_same_end(texts: list[str]) -> None:
    env = TextEnv(PingEnv, [TASK], max_turns=4, failed_parse_reward=-0.3)
    env.reset(seed=0)
    for text in texts:
        _, reward, terminated, truncated, info = env.step(text)
        if terminated or truncated:
            break
    [[episode]] = collect_groups(
        PingEnv, [TASK], Texts(texts), max_turns=4, failed_parse_reward=-0.3
    )
    assert (episode.reward, episode.terminated) == (reward, terminated)
    assert episode.truncated == truncated
    assert episode.truncation_cause == info.get("truncation_cause")
    assert episode.metrics == info["metrics"] and episode.num_turns == info["turn"]
    assert info.get("parse_error") == episode.turns[-1].parse_error  # the parser's reason
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("done")


def test_the_act_that_ends_an_episode_returns_the_drivers_record_of_it(mode: str) -> None:
    """One record from start to end: the driver writes the task, the opening, the tools and
    the ending into it; the next start makes a new record and leaves the finished one as is."""
    driver = EpisodeDriver(as_env_factory(PingEnv))
    first = play(driver, [CALL, "done"], mode)[-1]
    assert first is not None and first.task is TASK and first.num_opening_messages == 1
    assert first.tool_specs == [] and first.action_format is driver.action_format
    second = play(driver, ["stop"], mode)[-1]
    assert second is driver.episode and second is not first
    assert ending(first) == (1.0, True, None, {"answered": 1})
    assert ending(second) == (0.5, False, TruncationCause.ENV, {"why": 1})


class SilentEcho(PingEnv):
    """Like PingEnv, but its history never holds the assistant's messages (no echo)."""

    async def step(self, message) -> StepResult:
        result = await super().step(message)
        kept = [m for m in result.messages if m.get("role") != "assistant"]
        return StepResult(result.terminated, result.truncated, kept, result.reward, result.metrics)


def test_replies_are_found_whether_or_not_the_env_echoes_the_action(mode: str) -> None:
    for factory in (PingEnv, SilentEcho):
        driver = EpisodeDriver(as_env_factory(factory))
        play(driver, [CALL], mode)
        assert driver.replies() == [{"role": "tool", "name": "ping", "content": "pong"}]
    env = TextEnv(SilentEcho, [TASK])
    env.reset(seed=0)
    observation = env.step(CALL)[0]
    assert "pong" in observation and "<tool_response>" in observation


class BrokenReset(PingEnv):
    async def reset(self, task: Task) -> list:
        if task.prompt == "break":
            raise RuntimeError("reset failed")
        return await super().reset(task)


def test_a_failed_reset_leaves_the_text_env_needing_a_reset() -> None:
    env = TextEnv(BrokenReset, [TASK])
    env.reset(seed=0)
    env.step(CALL)
    with pytest.raises(RuntimeError, match="reset failed"):
        env.reset(options={"task": "break"})
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step(CALL)
    env.unwrapped.max_turns = 1  # settable, and it reaches the driver
    env.reset(seed=0)
    assert env.step(CALL)[3] is True  # truncated at the new limit


def test_a_pickled_driver_keeps_playing_an_async_env() -> None:
    import pickle

    driver = EpisodeDriver(as_env_factory(PingEnv))
    driver.start_sync(TASK)
    assert driver.act_sync(CALL) is None
    copy = pickle.loads(pickle.dumps(driver))
    assert copy.runner is None
    assert ending(copy.act_sync("done")) == (1.0, True, None, {"answered": 1})


class TypedPing(PingEnv):
    """PingEnv offering a ``ping`` tool whose ``tag`` parameter is a string."""

    @property
    def tool_specs(self) -> list:
        properties = {"tag": {"type": "string"}, "n": {"type": "integer"}}
        parameters = {"type": "object", "properties": properties}
        return [{"type": "function", "function": {"name": "ping", "parameters": parameters}}]


def test_the_parser_is_bound_to_the_episode_s_tools() -> None:
    driver = EpisodeDriver(as_env_factory(TypedPing), action_format="qwen3_coder")
    driver.start_sync(TASK)
    text = "<function=ping>\n<parameter=tag>\n42\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
    assert driver.act_sync(text + "</function>") is None
    assert driver.parsed is not None
    arguments = driver.parsed.tool_calls[0]["function"]["arguments"]
    assert arguments == '{"tag": "42", "n": 7}'  # typed by the schema: the string stays text
    driver.close_sync()


def test_the_optional_hooks_default_to_nothing() -> None:
    env = PingEnv()
    assert asyncio.run(env.conclude("max_turns")) is None
    assert env.defer_scoring() is None and env.note_tokens(7) is None
    assert env.scoring_pending is False and env.scoring_key is env and env.tool_choice is None
    with pytest.raises(NotImplementedError, match="PingEnv"):
        asyncio.run(env.score_group([env]))


class Duck:
    """An env-like object that does not subclass Env."""

    tool_specs: list = []

    async def reset(self, task: Task) -> list:
        return [{"role": "user", "content": "hi"}]


def test_a_factory_must_return_an_env(mode: str) -> None:
    driver = EpisodeDriver(lambda task: Duck())
    with pytest.raises(InvalidArgumentError, match="returned a Duck.*subclass Env"):
        play(driver, ["done"], mode)


class Hooked(PingEnv):
    """PingEnv that records what the loop tells it, scores cut episodes, asks for a tool."""

    tool_choice = "required"

    def __init__(self) -> None:
        super().__init__(cap=2)
        self.tokens: list[int] = []
        self.causes: list[str] = []
        self.deferred = False

    def note_tokens(self, total: int) -> None:
        self.tokens.append(total)

    def defer_scoring(self) -> None:
        self.deferred = True

    async def conclude(self, cause: str) -> StepResult:
        self.causes.append(cause)
        return StepResult(False, True, self.messages, 0.25, {"concluded": 1})


def test_the_loop_calls_each_declared_hook(small_model) -> None:
    envs: list[Hooked] = []
    seen: list[PolicyRequest] = []

    class Calls(Policy):
        async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
            seen.extend(requests)
            return [Generation(text=CALL, token_ids=[1, 2, 3]) for _ in requests]

    def factory(task: Task) -> Hooked:
        envs.append(Hooked())
        return envs[-1]

    [[episode]] = collect_groups(factory, [TASK], Calls(), max_turns=5, tokenizer=small_model[1])
    (env,) = envs
    assert env.deferred and env.causes == ["max_turns"]
    assert episode.reward == 0.25 and episode.metrics["concluded"] == 1
    assert len(env.tokens) == 2 and env.tokens[0] < env.tokens[1]
    assert [r.tool_choice for r in seen] == ["required", "required"]


class SuspendsThenAsksForTheLoop(PingEnv):
    """Synchronous by declaration; a tool call suspends, then uses the running loop (as SQL-v0's
    query does): the one path finishes such a step on the runner's loop."""

    synchronous = True  # type: ignore[assignment]

    async def step(self, message) -> StepResult:
        if message.get("tool_calls"):
            await asyncio.sleep(0)
            await asyncio.get_running_loop().run_in_executor(None, lambda: None)
        return await super().step(message)


def test_a_synchronous_step_that_suspends_is_finished_on_the_loop() -> None:
    driver = EpisodeDriver(as_env_factory(SuspendsThenAsksForTheLoop))
    end = play(driver, ["done"], "sync")[-1]
    assert ending(end) == (1.0, True, None, {"answered": 1})
    assert not driver.runner.has_loop  # nothing suspended: no loop was made
    end = play(driver, [CALL, "done"], "sync")[-1]
    assert ending(end) == (1.0, True, None, {"answered": 1})
    assert driver.runner.has_loop


def test_no_module_uses_asyncios_private_running_loop_api() -> None:
    from pathlib import Path

    import llm_gym

    root = Path(llm_gym.__file__).parent
    private = ("_get_running_loop", "_set_running_loop")
    hits = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(name in path.read_text(encoding="utf-8") for name in private)
    ]
    assert hits == []
