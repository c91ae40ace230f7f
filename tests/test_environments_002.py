"""Document 002's EnvironmentMultiTurn runs on llm_gym with only its imports changed: through the
async loop, run_and_report, TextEnv and gym.make; plus stateless replay, per-turn rewards,
score_episodes concurrency, SFT targets and TaskExample <-> Task."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import pickle
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from llm_gym import Task, TruncationCause
from llm_gym.datasets import TaskExample
from llm_gym.environments import (
    SAMPLED_KEY,
    EnvironmentEpisode,
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    EnvironmentTurn,
    MultiTurnEnvAdapter,
    MultiTurnEnvFactory,
    MultiTurnTaskSource,
    RewardResult,
    parse_chatml,
    register_multi_turn_env,
    replay_state,
    sampled_actions,
    score_episodes_async,
    sft_messages,
)
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import run_and_report
from llm_gym.gym import TextEnv, register_env
from llm_gym.gym.registration import unregister_env
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups
from tests.seeds.agent_env import AgentEnv, load_environment
from tests.test_driver_hostile import Say

# ---------------------------------------------------------------------------------------------
# Document 002's AgentEnv
# ---------------------------------------------------------------------------------------------

GET = '<tool_call>{"name": "get_order", "args": {"order_id": "A1001"}}</tool_call>'
REFUND = '<tool_call>{"name": "refund_order", "args": {"order_id": "A1001"}}</tool_call>'
AGENT_TASKS = [
    Task(prompt="Refund my last order.", target="refund_order", id="refund"),
    Task(prompt="Please refund order A1001.", target="refund_order", id="refund-2"),
]


def _sampled_so_far(request: PolicyRequest, opening: int) -> int:
    return sum(m["role"] == "assistant" for m in request.messages[opening:])


class ScriptedAgent(Policy):
    """Looks the order up, refunds it, then replies (or, with refund=False, never refunds)."""

    name = "scripted-agent"

    def __init__(self, refund: bool = True) -> None:
        self.refund = refund

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        script = [GET, REFUND if self.refund else GET, "Your order A1001 was refunded."]
        return [Generation(text=script[min(_sampled_so_far(r, 2), 2)]) for r in requests]


def test_agent_env_through_collect_groups() -> None:
    groups = collect_groups(
        AgentEnv(), AGENT_TASKS, ScriptedAgent(), episodes_per_task=3, max_turns=8
    )
    for group in groups:
        for episode in group:
            assert episode.error is None
            assert (episode.reward, episode.terminated, episode.truncated) == (1.0, True, False)
            assert episode.metrics["success"] is True and episode.num_turns == 3
            assert [m["role"] for m in episode.messages] == [
                "system", "user", "assistant", "user", "assistant", "user", "assistant",
            ]  # fmt: skip
            # the env received (and the transcript keeps) the raw assistant text
            assert (
                episode.messages[2]["content"] == GET and episode.messages[4]["content"] == REFUND
            )
            assert "<tool_result>" in episode.messages[5]["content"]
            assert '"refunded": 42.5' in episode.messages[5]["content"]
            assert all(SAMPLED_KEY not in m for m in episode.messages)  # markers stay inside
            assert episode.turns[0].env_messages[0]["content"].startswith("<tool_result>")


def test_agent_env_scores_zero_without_the_resolving_action() -> None:
    [[episode]] = collect_groups(
        AgentEnv, AGENT_TASKS[:1], ScriptedAgent(refund=False), max_turns=8
    )
    assert (episode.reward, episode.terminated) == (0.0, True)
    assert episode.metrics["success"] is False


def test_agent_env_takes_a_malformed_call_as_a_reply_not_a_parse_failure() -> None:
    class Unclosed(Policy):
        async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
            return [Generation(text='<tool_call>{"name": "refund_order"') for _ in requests]

    [[episode]] = collect_groups(load_environment(), AGENT_TASKS[:1], Unclosed(), max_turns=8)
    # Hermes cannot parse it, but the environment parses its own protocol: no tool call, a reply.
    assert episode.truncation_cause is None and episode.terminated and episode.reward == 0.0
    assert episode.turns[0].parse_kind == "parse_failure"
    assert episode.messages[-1]["content"] == '<tool_call>{"name": "refund_order"'


def test_agent_env_through_run_and_report() -> None:
    report = run_and_report(
        AgentEnv, ScriptedAgent(), tasks=AGENT_TASKS, k=2, progress=False, print_report=False
    )
    assert report.env_id == "AgentEnv"
    assert report.metrics["success_rate"] == 1.0 and report.metrics["pass_at_k"] == 1.0
    assert report.metrics["terminated_ratio"] == 1.0 and report.metrics["turns_mean"] == 3.0
    floor = run_and_report(
        MultiTurnEnvFactory("tests.seeds.agent_env:load_environment"),
        ScriptedAgent(refund=False),
        tasks=AGENT_TASKS,
        progress=False,
        print_report=False,
    )
    assert floor.env_id == "load_environment" and floor.metrics["success_rate"] == 0.0


def test_agent_env_through_text_env() -> None:
    env = TextEnv(AgentEnv, AGENT_TASKS, max_turns=8)
    observation, info = env.reset(seed=0, options={"index": 0})
    assert "Call tools with <tool_call>" in observation and "Refund my last order." in observation
    assert info["tool_specs"] == []
    observation, reward, terminated, truncated, info = env.step(GET)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert observation.startswith("<tool_result>") and '"item": "kettle"' in observation
    env.step(REFUND)
    observation, reward, terminated, truncated, info = env.step("Refunded.")
    assert (observation, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["metrics"]["success"] is True
    assert env.inner_env is None  # closed


@pytest.fixture
def temporary_ids() -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for env_id in ids:
        unregister_env(env_id)


def _play_agent(env: gym.Env, **reset) -> tuple[float, dict]:
    env.reset(**reset)
    for action in (GET, REFUND, "Done."):
        _obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return reward, info


def test_register_multi_turn_env_and_gym_make(temporary_ids: list[str]) -> None:
    temporary_ids.append("Doc002Agent-v0")
    entry = register_multi_turn_env(
        "Doc002Agent-v0",
        "tests.seeds.agent_env:load_environment",
        description="document 002's AgentEnv",
        prompt_text="You are a support agent.",
    )
    # registering again with the same settings is a no-op
    assert (
        register_multi_turn_env(
            "Doc002Agent-v0",
            "tests.seeds.agent_env:load_environment",
            description="document 002's AgentEnv",
            prompt_text="You are a support agent.",
        )
        == entry
    )
    env = gym.make("Doc002Agent-v0")
    observation, info = env.reset(seed=0)
    # tasks default to the environment's own dataset
    assert info["task"] == Task(prompt="Refund my last order.", target="refund_order")
    assert observation.startswith("You are a support agent.\n\nCall tools with")
    reward, info = _play_agent(env, seed=0)
    assert reward == 1.0 and info["metrics"]["success"] is True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    # pickling mid-episode keeps the episode going
    env.reset(seed=1)
    env.step(GET)
    clone = pickle.loads(pickle.dumps(env))
    assert clone.step(REFUND)[:4] == env.step(REFUND)[:4]
    # the id works in run_and_report, with the registered (dataset) tasks
    report = run_and_report(
        "Doc002Agent-v0", ScriptedAgent(), split="train", progress=False, print_report=False
    )
    assert report.tasks == 1 and report.metrics["success_rate"] == 1.0


def test_register_env_wraps_an_environment_multi_turn_class(temporary_ids: list[str]) -> None:
    temporary_ids.append("Doc002AgentPlain-v0")
    register_env("Doc002AgentPlain-v0", env=AgentEnv, tasks=AGENT_TASKS, max_turns=8)
    reward, info = _play_agent(gym.make("Doc002AgentPlain-v0"), seed=0)
    assert reward == 1.0 and info["turn"] == 3


# ---------------------------------------------------------------------------------------------
# Guess the number: the `flash env setup --multi-turn` starter, stateless, with per-turn credit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuessState:
    secret: int
    low: int = 1
    high: int = 10
    solved: bool = False
    consistent: tuple[bool, ...] = ()

    @property
    def count(self) -> int:
        return len(self.consistent)


def reduce_guess(state: GuessState, action: str) -> GuessState:
    """Pure: apply one guess."""
    try:
        guess = int(action.strip())
    except ValueError:
        return replace(state, consistent=(*state.consistent, False))
    ok = state.low <= guess <= state.high and not state.solved
    low = max(state.low, guess + 1) if guess < state.secret else state.low
    high = min(state.high, guess - 1) if guess > state.secret else state.high
    return GuessState(
        state.secret, low, high, state.solved or guess == state.secret, (*state.consistent, ok)
    )


class GuessEnv(EnvironmentMultiTurn):
    """Guess a secret number in [1, 10]; the transcript is the only state."""

    turns = 6
    scored: list[EnvironmentEpisode] = []  # test instrumentation only

    def start_episode(self, example: TaskExample, prompt_text: str) -> list[dict]:
        return [
            {"role": "system", "content": "Reply with one integer. Example round below."},
            {"role": "assistant", "content": "5"},  # a demonstration: never replayed
            {"role": "user", "content": example.input},
        ]

    def max_episode_turns(self, example: TaskExample) -> int:
        return self.turns

    def step_episode(self, example, messages, assistant_response):
        state = replay_state(
            GuessState(secret=int(example.output)), reduce_guess, messages, assistant_response
        )
        if state.solved:
            return EnvironmentStepResult(
                done=True, final_response_text=assistant_response, metadata={"guesses": state.count}
            )
        try:
            hint = "higher" if int(assistant_response) < state.secret else "lower"
        except ValueError:
            hint = "say a number"
        return EnvironmentStepResult(
            done=False,
            messages=({"role": "user", "content": f"{hint} (guess #{state.count})"},),
            metadata={"guesses": state.count},
        )

    def score_episode(self, example: TaskExample, episode: EnvironmentEpisode) -> RewardResult:
        self.scored.append(episode)
        state = replay_state(GuessState(secret=int(example.output)), reduce_guess, episode.messages)
        per_turn = [1.0 if ok else 0.0 for ok in state.consistent]
        assert len(per_turn) == len([t for t in episode.turns if t.role == "assistant"])
        score = 1.0 if state.solved else 0.1 * sum(per_turn)
        return RewardResult(
            score=score,
            threshold=1.0,
            metadata={"per_turn_rewards": per_turn, "guesses": state.count},
        )


class ScriptedGuesses(Policy):
    def __init__(self, guesses: list[str]) -> None:
        self.guesses = guesses

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        # 3 opening messages, one of them an assistant demonstration
        return [Generation(text=self.guesses[_sampled_so_far(r, 3)]) for r in requests]


GUESS_TASK = Task(prompt="I picked a number between 1 and 10. Guess it.", target=7)


def test_guess_env_per_turn_rewards_reach_episode_turns() -> None:
    GuessEnv.scored.clear()
    groups = collect_groups(
        GuessEnv(), [GUESS_TASK], ScriptedGuesses(["5", "9", "3", "7"]), episodes_per_task=3,
        max_turns=10,
    )  # fmt: skip
    for episode in groups[0]:
        assert episode.error is None
        assert (episode.reward, episode.terminated) == (1.0, True)
        # "5" consistent, "9" consistent, "3" below the known bound, "7" solves it
        assert [t.reward for t in episode.turns] == [1.0, 1.0, 0.0, 1.0]
        assert episode.per_turn_rewards == [1.0, 1.0, 0.0, 1.0]
        assert "per_turn_rewards" not in episode.metrics and episode.metrics["guesses"] == 4
        # the demonstration "5" was not replayed: the first reply counts guess #1
        assert episode.messages[4]["content"] == "higher (guess #1)"
        assert episode.messages[8]["content"] == "higher (guess #3)"
    scored = GuessEnv.scored[0]
    assert [t.role for t in scored.turns] == ["assistant", "user"] * 3 + ["assistant"]
    assert [t.metadata["sampled"] for t in scored.turns] == [True, False] * 3 + [True]
    assert [t.metadata["action"] for t in scored.turns] == [0, 0, 1, 1, 2, 2, 3]
    assert scored.messages[1] == {"role": "assistant", "content": "5", SAMPLED_KEY: False}
    assert scored.metadata["steps"] == [{"guesses": n} for n in (1, 2, 3, 4)]
    assert scored.response_text == "7" and scored.latency_ms is not None


def test_guess_env_turn_cap_scores_the_episode_and_truncates() -> None:
    env = GuessEnv()
    env.turns = 3
    [[episode]] = collect_groups(env, [GUESS_TASK], ScriptedGuesses(["5", "9", "8"]), max_turns=10)
    # the env's own cap is a length budget, as the run's is: MAX_TURNS (not ENV), still scored
    assert episode.truncated and not episode.terminated and episode.truncation_cause == "max_turns"
    assert math.isclose(episode.reward, 0.3)  # scored, as document 002's loop does
    assert episode.metrics["turn_cap_reached"] == 1 and episode.metrics["success"] is False
    assert episode.per_turn_rewards == [1.0, 1.0, 1.0] and episode.num_turns == 3


def test_guess_env_through_text_env_and_adapter_records() -> None:
    env = TextEnv(GuessEnv, [GUESS_TASK], max_turns=10)
    env.reset(seed=0)
    assert env.step("4")[0] == "higher (guess #1)"
    adapter = env.inner_env
    assert isinstance(adapter, MultiTurnEnvAdapter) and adapter.max_turns == 6
    assert adapter.transcript[-2][SAMPLED_KEY] is True
    assert SAMPLED_KEY not in adapter.messages[-2]
    _obs, reward, terminated, _truncated, info = env.step("7")
    assert (reward, terminated) == (1.0, True)
    assert info["metrics"]["per_turn_rewards"] == [1.0, 1.0]


def test_invalid_per_turn_rewards_are_ignored_with_a_warning() -> None:
    class WrongLength(GuessEnv):
        def score_episode(self, example, episode):
            return RewardResult(score=0.5, metadata={"per_turn_rewards": [1.0]})

    class NotFinite(GuessEnv):
        def score_episode(self, example, episode):
            return RewardResult(score=0.5, metadata={"per_turn_rewards": [1.0, math.nan]})

    for env in (WrongLength(), NotFinite()):
        with pytest.warns(UserWarning, match="per_turn_rewards"):
            [[episode]] = collect_groups(
                env, [GUESS_TASK], ScriptedGuesses(["3", "7"]), max_turns=10
            )
        assert episode.reward == 0.5 and episode.per_turn_rewards is None
        assert episode.metrics["per_turn_rewards_invalid"] == 1


# ---------------------------------------------------------------------------------------------
# Replay helpers (pure functions)
# ---------------------------------------------------------------------------------------------

PROMPT = [
    {"role": "system", "content": "rules"},
    {"role": "assistant", "content": "demo"},
    {"role": "user", "content": "go"},
]


def test_sampled_actions_rules() -> None:
    unmarked = [*PROMPT, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "r"}]
    assert sampled_actions(unmarked) == ["demo", "a1"]  # role alone
    assert sampled_actions(unmarked, prompt_length=3) == ["a1"]  # position after the prompt
    marked = [
        {**PROMPT[0]},
        {**PROMPT[1], SAMPLED_KEY: False},
        {**PROMPT[2]},
        {"role": "assistant", "content": "a1", SAMPLED_KEY: True},
        {"role": "assistant", "content": "env says", SAMPLED_KEY: False},
    ]
    assert sampled_actions(marked) == ["a1"]
    assert sampled_actions(marked[:3]) == []  # the first step's history: only the demonstration
    assert sampled_actions(unmarked, is_sampled=lambda m: m.get("content") == "demo") == ["demo"]
    with pytest.raises(InvalidArgumentError, match="prompt_length"):
        sampled_actions(unmarked, prompt_length=-1)


def test_replay_state_invariants() -> None:
    history = [
        {**PROMPT[1], SAMPLED_KEY: False},
        {"role": "assistant", "content": "a", SAMPLED_KEY: True},
        {"role": "user", "content": "ok"},
    ]
    current = {"role": "assistant", "content": "b", SAMPLED_KEY: True}
    applied: list[str] = []

    def effect(state: tuple[str, ...], action: str) -> tuple[str, ...]:
        applied.append(action)
        return (*state, action.upper())

    messages = [*history, current]
    state = replay_state((), lambda s, a: (*s, a), messages, "b", apply_current=effect)
    assert state == ("a", "B") and applied == ["b"]  # history replayed purely, effect once
    assert replay_state((), lambda s, a: (*s, a), messages) == ("a", "b")  # scoring: all of it
    with pytest.raises(InvalidArgumentError, match=r"messages\[-1\]"):
        replay_state((), lambda s, a: s, messages, "not the last action")
    with pytest.raises(InvalidArgumentError, match=r"messages\[-1\]"):
        replay_state((), lambda s, a: s, history, "ok")


# ---------------------------------------------------------------------------------------------
# score_episodes: the concurrent default, overrides, async hooks
# ---------------------------------------------------------------------------------------------


class SlowScorer(EnvironmentMultiTurn):
    max_score_concurrency = 4

    def __init__(self) -> None:
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def score_episode(self, example, episode):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.03)
        with self.lock:
            self.active -= 1
        return RewardResult(score=float(episode.response_text))


EXAMPLE = TaskExample(input="x")


def _episodes(n: int) -> list[EnvironmentEpisode]:
    return [EnvironmentEpisode(messages=(), response_text=str(i)) for i in range(n)]


def test_score_episodes_default_runs_score_episode_concurrently() -> None:
    assert EnvironmentMultiTurn.max_score_concurrency == 8
    env = SlowScorer()
    results = env.score_episodes(EXAMPLE, _episodes(12))
    assert [r.score for r in results] == [float(i) for i in range(12)] and env.peak == 4

    class Wide(SlowScorer):
        max_score_concurrency = 8

    wide = Wide()
    wide.score_episodes(EXAMPLE, _episodes(16))
    assert wide.peak == 8
    env = SlowScorer()
    results = asyncio.run(score_episodes_async(env, EXAMPLE, _episodes(10)))
    assert [r.score for r in results] == [float(i) for i in range(10)] and env.peak == 4


class BatchScored(EnvironmentMultiTurn):
    """One reply ends the episode; scores come from an overridden score_episodes."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def max_episode_turns(self, example):
        return 2

    def step_episode(self, example, messages, assistant_response):
        return EnvironmentStepResult(done=True)

    def score_episodes(self, example, episodes):
        self.batches.append(len(episodes))
        return [RewardResult(score=len(e.response_text)) for e in episodes]


class Echo(Policy):
    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        return [Generation(text="abc") for _ in requests]


def test_group_episodes_are_scored_with_one_score_episodes_call() -> None:
    env = BatchScored()
    groups = collect_groups(env, AGENT_TASKS, Echo(), episodes_per_task=4, max_turns=4)
    assert env.batches == [4, 4]
    assert [e.reward for g in groups for e in g] == [3.0] * 8
    solo = BatchScored()
    collect_groups(
        MultiTurnEnvFactory(solo, batch_scoring=False), AGENT_TASKS, Echo(), episodes_per_task=4,
        max_turns=4,
    )  # fmt: skip
    assert solo.batches == [1] * 8


class Picky(BatchScored):
    score_episodes = EnvironmentMultiTurn.score_episodes  # back to the default

    def score_episode(self, example, episode):
        if episode.response_text == "bad":
            raise ValueError("cannot grade this one")
        return RewardResult(score=1.0)


class Alternate(Policy):
    def __init__(self) -> None:
        self.calls = 0

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        self.calls += len(requests)
        return [Generation(text="bad" if i % 2 else "good") for i in range(len(requests))]


def test_a_failing_score_episode_fails_only_its_own_episode() -> None:
    groups = collect_groups(Picky(), [GUESS_TASK], Alternate(), episodes_per_task=4, max_turns=2)
    assert [e.reward for e in groups[0]] == [1.0, 0.0, 1.0, 0.0]
    assert [e.error is not None for e in groups[0]] == [False, True, False, True]
    assert "cannot grade this one" in groups[0][1].error
    mixed = [*_episodes(1), EnvironmentEpisode(messages=(), response_text="bad")]
    with pytest.raises(ValueError, match="cannot grade"):
        asyncio.run(score_episodes_async(Picky(), EXAMPLE, mixed))


class AsyncGuess(GuessEnv):
    async def step_episode(self, example, messages, assistant_response):
        await asyncio.sleep(0)
        return super().step_episode(example, messages, assistant_response)

    async def score_episode(self, example, episode):
        await asyncio.sleep(0)
        return super().score_episode(example, episode)


def test_async_hooks_and_offloaded_hooks() -> None:
    for factory in (AsyncGuess(), MultiTurnEnvFactory(GuessEnv(), offload_hooks=True)):
        groups = collect_groups(
            factory, [GUESS_TASK], ScriptedGuesses(["5", "7"]), episodes_per_task=2, max_turns=10
        )
        assert [e.reward for e in groups[0]] == [1.0, 1.0]
        assert groups[0][0].per_turn_rewards == [1.0, 1.0]
    env = TextEnv(AsyncGuess, [GUESS_TASK], max_turns=10)
    env.reset(seed=0)
    assert env.step("7")[1:3] == (1.0, True)
    # the sync default score_episodes also drives an async score_episode
    episode = EnvironmentEpisode(
        messages=({"role": "assistant", "content": "7", SAMPLED_KEY: True},),
        response_text="7",
        turns=(EnvironmentTurn(role="assistant", content="7"),),
    )
    [result] = AsyncGuess().score_episodes(TaskExample(input="?", output=7), [episode])
    assert result.score == 1.0


def test_adapter_direct_use_and_errors() -> None:
    adapter = MultiTurnEnvAdapter(GuessEnv(), "ignored by GuessEnv")
    with pytest.raises(InvalidArgumentError, match="reset"):
        asyncio.run(adapter.step({"role": "assistant", "content": "1"}))

    async def play() -> None:
        opening = await adapter.reset(GUESS_TASK)
        assert [m["role"] for m in opening] == ["system", "assistant", "user"]
        assert adapter.tool_specs == [] and adapter.synchronous
        result = await adapter.step({"role": "assistant", "content": "7"})
        assert result.terminated and result.reward == 1.0
        assert adapter.reward_result is not None and adapter.reward_result.passed is True
        assert adapter.environment_episode is not None
        with pytest.raises(InvalidArgumentError, match="ended"):
            await adapter.step({"role": "assistant", "content": "7"})

    asyncio.run(play())

    class BadStep(GuessEnv):
        def step_episode(self, example, messages, assistant_response):
            return {"done": True}

    [[episode]] = collect_groups(BadStep(), [GUESS_TASK], ScriptedGuesses(["1"]), max_turns=2)
    assert "must return an EnvironmentStepResult" in episode.error
    with pytest.raises(InvalidArgumentError, match="EnvironmentMultiTurn"):
        MultiTurnEnvAdapter(object())  # type: ignore[arg-type]


def test_a_parsed_message_with_tool_calls_is_rendered_back_to_text() -> None:
    seen: list[str] = []

    class Recorder(GuessEnv):
        def step_episode(self, example, messages, assistant_response):
            seen.append(assistant_response)
            return EnvironmentStepResult(done=True)

    adapter = MultiTurnEnvAdapter(Recorder())
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}

    async def play() -> None:
        await adapter.reset(GUESS_TASK)
        await adapter.step({"role": "assistant", "content": "", "tool_calls": [call]})

    asyncio.run(play())
    assert seen == ['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>']


# ---------------------------------------------------------------------------------------------
# Records, SFT targets, factories
# ---------------------------------------------------------------------------------------------


def test_task_example_and_task_convert_both_ways() -> None:
    task = Task(prompt="Refund my last order.", target="refund_order", metadata={"k": 1}, id="t1")
    example = TaskExample.from_task(task)
    assert (example.input, example.output, dict(example.metadata), example.id) == (
        "Refund my last order.", "refund_order", {"k": 1}, "t1",
    )  # fmt: skip
    assert example.to_task() == task
    assert TaskExample.coerce({"input": "a", "output": 2}) == TaskExample(input="a", output=2)
    assert TaskExample.coerce(task) == example and TaskExample.coerce("hi").input == "hi"
    assert Task.from_dict(example.to_dict()) == task
    with pytest.raises(InvalidArgumentError, match="input"):
        TaskExample(input=3)  # type: ignore[arg-type]


def test_reward_result_and_record_defaults() -> None:
    assert RewardResult(score=0.5).passed is None and RewardResult(score=1, threshold=1).passed
    assert RewardResult(score=0.5, threshold=1.0).passed is False
    assert RewardResult(score=1, metadata={"per_turn_rewards": [1]}).per_turn_rewards == [1]
    for bad in (math.nan, math.inf, True, "1"):
        with pytest.raises(InvalidArgumentError, match="score"):
            RewardResult(score=bad)  # type: ignore[arg-type]
    step = EnvironmentStepResult()
    assert (step.done, step.messages, step.final_response_text, step.metadata) == (
        True, (), None, {},
    )  # fmt: skip
    episode = EnvironmentEpisode(messages=(), response_text="")
    assert (episode.turns, episode.metadata, episode.latency_ms, episode.total_tokens) == (
        (), {}, None, None,
    )  # fmt: skip
    assert EnvironmentTurn(role="user", content="hi").name is None
    with pytest.raises(AttributeError):
        step.done = False  # type: ignore[misc]


def test_sft_completion_defaults() -> None:
    env = AgentEnv()

    def target(output):
        return env.sft_completion(TaskExample(input="q", output=output))

    assert target("refund_order") == [{"role": "assistant", "content": "refund_order"}]
    assert target(42) == [{"role": "assistant", "content": "42"}]
    transcript = [
        {"role": "assistant", "content": GET},
        {"role": "user", "content": "<tool_result>[]</tool_result>"},
        {"role": "assistant", "content": "Done."},
    ]
    assert target(transcript) == transcript and target(tuple(transcript)) == transcript
    assert target({"role": "assistant", "content": "x"}) == [{"role": "assistant", "content": "x"}]
    chatml = "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n"
    assert target(chatml) == [
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "B"},
    ]
    with pytest.warns(UserWarning, match="ChatML"):
        assert target("<|im_start|>assistant\nunclosed") == [
            {"role": "assistant", "content": "<|im_start|>assistant\nunclosed"}
        ]
    with pytest.raises(InvalidArgumentError, match="no output"):
        target(None)
    with pytest.raises(InvalidArgumentError, match="Target message 0"):
        target([{"content": "no role"}])
    prompt, completion = sft_messages(env, {"input": "Refund it.", "output": "Sure."}, "Be brief.")
    assert [m["role"] for m in prompt] == ["system", "user"] and prompt[0]["content"].startswith(
        "Be brief."
    )
    assert completion == [{"role": "assistant", "content": "Sure."}]
    assert parse_chatml("plain text") is None


def test_default_start_episode_and_missing_hooks() -> None:
    class Minimal(EnvironmentMultiTurn):
        pass

    env = Minimal()
    assert env.start_episode(EXAMPLE, "") == [{"role": "user", "content": "x"}]
    assert env.start_episode(EXAMPLE, "sys ") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "x"},
    ]
    with pytest.raises(NotImplementedError, match="max_episode_turns"):
        env.max_episode_turns(EXAMPLE)
    [[episode]] = collect_groups(Minimal(), [GUESS_TASK], Echo(), max_turns=2)
    assert "max_episode_turns" in episode.error


def test_factory_is_picklable_comparable_and_reads_the_dataset() -> None:
    factory = MultiTurnEnvFactory("tests.seeds.agent_env:load_environment", prompt_text="p")
    assert factory == MultiTurnEnvFactory("tests.seeds.agent_env:load_environment", prompt_text="p")
    assert factory != MultiTurnEnvFactory("tests.seeds.agent_env:load_environment")
    assert isinstance(factory(AGENT_TASKS[0]), MultiTurnEnvAdapter)
    for clone in (pickle.loads(pickle.dumps(factory)), copy.deepcopy(factory)):
        assert clone == factory and isinstance(clone.environment_for(), AgentEnv)
    source = MultiTurnTaskSource(factory)
    assert source("train") == [Task(prompt="Refund my last order.", target="refund_order")]
    assert source == MultiTurnTaskSource(copy.deepcopy(factory))
    with pytest.raises(InvalidArgumentError, match="dataset"):
        MultiTurnEnvFactory(GuessEnv()).tasks()
    with pytest.raises(InvalidArgumentError, match="must return an EnvironmentMultiTurn"):
        MultiTurnEnvFactory(lambda: object()).environment_for()
    json.dumps(factory.__qualname__)  # a readable name for reports
    assert factory.__qualname__ == "load_environment"


def test_exports() -> None:
    import llm_gym.datasets
    import llm_gym.environments

    for module in (llm_gym.environments, llm_gym.datasets, llm_gym):
        assert [name for name in module.__all__ if not hasattr(module, name)] == []
    assert llm_gym.datasets.TaskExample is llm_gym.environments.TaskExample


def test_the_run_max_turns_bounds_a_document_002_episode_too() -> None:
    """``max_episode_turns`` and the run's ``max_turns`` bound the episode together: an env
    cap of 6 does not override ``max_turns=2``."""
    [[episode]] = collect_groups(
        GuessEnv(), [GUESS_TASK], ScriptedGuesses(["1", "2", "3", "4"]), max_turns=2
    )
    assert episode.num_turns == 2 and episode.truncation_cause == "max_turns"


def test_scored_episodes_carry_their_total_tokens(small_model) -> None:
    """``EnvironmentEpisode.total_tokens``: the prompt and every turn, the last action included,
    as the rollout loop counted them, when ``score_episode`` sees the episode."""
    from llm_gym.policies import HFPolicy

    seen = []

    class Counting(GuessEnv):
        def score_episode(self, example, episode):
            seen.append(episode.total_tokens)
            return super().score_episode(example, episode)

    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, seed=0, max_new_tokens=6)
    [[episode]] = collect_groups(Counting(), [GUESS_TASK], policy, max_turns=10)
    [sample] = episode.samples
    last_action = max(i for i, m in enumerate(sample.env_mask) if m)  # the env's last reply
    assert seen == [len(sample.prompt_ids) + last_action + 1]  # is not part of it


# --- document 002's hooks -------------------------------------------------------------------------


def doc002_env(hook: str, value: Any) -> Any:
    from llm_gym.environments import (
        EnvironmentMultiTurn,
        EnvironmentStepResult,
        MultiTurnEnvFactory,
        RewardResult,
    )

    class Doc002(EnvironmentMultiTurn):
        def start_episode(self, example, prompt_text):
            return [{"role": "user", "content": prompt_text}]

        def max_episode_turns(self, example):
            return 2

        def step_episode(self, example, messages, assistant_response):
            return value if hook == "step" else EnvironmentStepResult(done=True)

        def score_episode(self, example, episode):
            return value if hook == "score" else RewardResult(score=1.0)

    return MultiTurnEnvFactory(Doc002())


DOC002 = {
    "score NaN": ("score", math.nan, "must be finite"),
    "score text": ("score", "1.0", "must return a RewardResult"),
    "score None": ("score", None, "must return a RewardResult"),
    "step None": ("step", None, "must return an EnvironmentStepResult"),
    "step text": ("step", "done", "must return an EnvironmentStepResult"),
}


@pytest.mark.parametrize("name", list(DOC002))
def test_document_002_hooks_that_return_nonsense_end_their_episode(name: str) -> None:
    hook, value, message = DOC002[name]
    groups = collect_groups(doc002_env(hook, value), [Task("x")], Say(), episodes_per_task=2,
                            max_turns=3)  # fmt: skip
    for episode in groups[0]:
        assert episode.truncation_cause is TruncationCause.ENV and episode.reward == 0.0
        assert message in episode.error
