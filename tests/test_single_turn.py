"""Document 002's EnvironmentSingleTurn (``build_prompt_messages``, ``score_response``) runs in
the same loop, evaluator, ``gym.make`` and trainer as EnvironmentMultiTurn, and a single-turn run
is the same run under either credit assignment."""

from __future__ import annotations

import asyncio
import copy
import doctest
import pickle
import re
import warnings
from collections.abc import Sequence

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llm_gym.environments
import llm_gym.environments.single_turn as single_turn_module
from llm_gym import Task
from llm_gym.core.factories import as_env_factory
from llm_gym.datasets import TaskExample
from llm_gym.environments import (
    EnvironmentEpisode,
    EnvironmentMultiTurn,
    EnvironmentSingleTurn,
    MultiTurnEnvFactory,
    RewardResult,
    SingleTurnAsMultiTurn,
    as_multi_turn,
    register_single_turn_env,
    sft_messages,
    single_turn_env_factory,
)
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import run_and_report
from llm_gym.gym import TextEnv, register_env
from llm_gym.gym.registration import unregister_env
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups
from tests.test_environments_002 import SlowScorer

# ---------------------------------------------------------------------------------------------
# A tiny single-turn environment: answer a sum
# ---------------------------------------------------------------------------------------------

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
ROWS = [{"input": f"What is {a} + {b}?", "output": a + b} for a, b in [(2, 3), (10, 7), (4, 4)]]
TASKS = [Task(prompt=row["input"], target=row["output"]) for row in ROWS]


def right_number(example: TaskExample, response_text: str) -> bool:
    return str(example.output) in re.findall(r"-?\d+", response_text)


class ArithmeticEnv(EnvironmentSingleTurn):
    """Score 1 when the reply contains the sum."""

    version = "3"

    def __init__(self, split: str = "train") -> None:
        self.split = split
        self.dataset = ROWS if split == "train" else ROWS[:1]

    def build_prompt_messages(self, example: TaskExample, prompt_text: str) -> list[dict]:
        return [
            {"role": "system", "content": f"{prompt_text} Reply with the number.".strip()},
            {"role": "user", "content": example.input},
        ]

    def score_response(self, example: TaskExample, response_text: str) -> RewardResult:
        return RewardResult(score=float(right_number(example, response_text)), threshold=1.0)


def load_environment(split: str = "train", **kwargs) -> ArithmeticEnv:
    return ArithmeticEnv(split=split)


def _episode(response_text: str) -> EnvironmentEpisode:
    return EnvironmentEpisode(messages=(), response_text=response_text)


class Solver(Policy):
    """Answers right; with ``wrong_every=n``, every n-th reply it writes is off by one."""

    name = "solver"

    def __init__(self, wrong_every: int = 0) -> None:
        self.wrong_every = wrong_every
        self.replies = 0

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        out = []
        for request in requests:
            question = next(m["content"] for m in request.messages if m["role"] == "user")
            a, b = map(int, QUESTION.search(question).groups())  # type: ignore[union-attr]
            self.replies += 1
            wrong = self.wrong_every and self.replies % self.wrong_every == 0
            out.append(Generation(text=f"The answer is {a + b + bool(wrong)}."))
        return out


# ---------------------------------------------------------------------------------------------
# (1) the rollout loop
# ---------------------------------------------------------------------------------------------


def test_single_turn_env_through_collect_groups() -> None:
    groups = collect_groups(ArithmeticEnv(), TASKS, Solver(wrong_every=2), episodes_per_task=4,
                            max_turns=8)  # fmt: skip
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    for group in groups:
        assert [e.reward for e in group] == [1.0, 0.0, 1.0, 0.0]
        for episode in group:
            assert episode.error is None and episode.num_turns == 1
            assert (episode.terminated, episode.truncated, episode.truncation_cause) == (
                True, False, None,
            )  # fmt: skip
            assert [m["role"] for m in episode.messages] == ["system", "user", "assistant"]
            assert episode.messages[0]["content"] == "Reply with the number."
            assert episode.metrics["success"] is (episode.reward == 1.0)
            assert episode.per_turn_rewards is None  # per-turn credit falls back: see below
    # a class, a load_environment function and a string work as well
    for env in (ArithmeticEnv, single_turn_env_factory(load_environment),
                single_turn_env_factory("tests.test_single_turn:ArithmeticEnv")):  # fmt: skip
        [[episode]] = collect_groups(env, TASKS[:1], Solver(), max_turns=1)
        assert episode.reward == 1.0 and episode.terminated


def test_a_group_is_scored_by_one_score_responses_call() -> None:
    class Batched(ArithmeticEnv):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[list[str]] = []

        def score_responses(self, example, responses):
            self.batches.append(list(responses))
            return [float(right_number(example, r)) for r in responses]

    env = Batched()
    groups = collect_groups(env, TASKS[:2], Solver(), episodes_per_task=3, max_turns=1)
    assert sorted(env.batches) == [["The answer is 17."] * 3, ["The answer is 5."] * 3]
    assert [e.reward for g in groups for e in g] == [1.0] * 6
    assert type(as_multi_turn(env)).score_episodes is not EnvironmentMultiTurn.score_episodes
    # without the override, the shim keeps the default (score_response per reply, isolated)
    default = type(as_multi_turn(ArithmeticEnv())).score_episodes
    assert default is EnvironmentMultiTurn.score_episodes


def test_the_default_score_responses_runs_score_response_concurrently() -> None:
    class Slow(EnvironmentSingleTurn):
        max_score_concurrency = 3

        def __init__(self) -> None:
            self.meter = SlowScorer()  # counts the calls running at once

        def score_response(self, example, response_text):
            return self.meter.score_episode(example, _episode(response_text))

    env = Slow()
    results = env.score_responses(TaskExample(input="x"), [str(i) for i in range(9)])
    assert [r.score for r in results] == [float(i) for i in range(9)] and env.meter.peak == 3
    # the view's score_episodes (EnvironmentMultiTurn's default) honours the same limit
    env.meter.peak = 0
    shim = as_multi_turn(env)
    results = shim.score_episodes(TaskExample(input="x"), [_episode(str(i)) for i in range(6)])
    assert [r.score for r in results] == [float(i) for i in range(6)] and env.meter.peak == 3
    assert shim.max_score_concurrency == 3


# ---------------------------------------------------------------------------------------------
# (2) the evaluator, (3) gym.make
# ---------------------------------------------------------------------------------------------


def test_single_turn_env_through_run_and_report() -> None:
    report = run_and_report(
        ArithmeticEnv, Solver(), tasks=TASKS, k=2, progress=False, print_report=False
    )
    assert report.env_id == "ArithmeticEnv" and report.env_version == "3"
    assert report.metrics["success_rate"] == 1.0 and report.metrics["pass_at_k"] == 1.0
    assert report.metrics["terminated_ratio"] == 1.0 and report.metrics["turns_mean"] == 1.0
    half = run_and_report(
        single_turn_env_factory(load_environment), Solver(wrong_every=2), tasks=TASKS * 2,
        progress=False, print_report=False,
    )  # fmt: skip
    assert half.env_id == "load_environment" and half.metrics["success_rate"] == 0.5


def test_register_single_turn_env_and_gym_make(request: pytest.FixtureRequest) -> None:
    request.addfinalizer(lambda: unregister_env("Doc002Sum-v0"))
    settings = dict(description="sums", prompt_text="You add numbers.")
    entry = register_single_turn_env(
        "Doc002Sum-v0", "tests.test_single_turn:load_environment", **settings
    )
    again = register_single_turn_env(  # the same settings again: a no-op
        "Doc002Sum-v0", "tests.test_single_turn:load_environment", **settings
    )
    assert again == entry
    assert entry.max_turns == 1
    env = gym.make("Doc002Sum-v0")
    observation, info = env.reset(seed=0, options={"index": 1})
    # tasks default to the environment's dataset (read per split)
    assert info["task"] == Task(prompt="What is 10 + 7?", target=17)
    assert observation.startswith("You add numbers. Reply with the number.")
    assert info["tool_specs"] == []
    observation, reward, terminated, truncated, info = env.step("It is 17.")
    assert (reward, terminated, truncated) == (1.0, True, False)  # one step ends the episode
    assert info["metrics"]["success"] is True and info["turn"] == 1
    env.reset(seed=0, options={"index": 1})
    assert env.step("It is 18.")[1:4] == (0.0, True, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    clone = pickle.loads(pickle.dumps(env))  # picklable, mid-episode too
    clone.reset(seed=0, options={"index": 0})
    assert clone.step("5")[1] == 1.0
    report = run_and_report(
        "Doc002Sum-v0", Solver(), split="val", progress=False, print_report=False
    )
    assert report.tasks == 1 and report.metrics["success_rate"] == 1.0  # the val dataset


def test_register_env_and_text_env_take_a_single_turn_class(request: pytest.FixtureRequest):
    request.addfinalizer(lambda: unregister_env("Doc002SumPlain-v0"))
    register_env("Doc002SumPlain-v0", env=ArithmeticEnv, tasks=TASKS, max_turns=4)
    env = gym.make("Doc002SumPlain-v0")
    env.reset(seed=0, options={"index": 2})
    assert env.step("8")[1:4] == (1.0, True, False)
    text_env = TextEnv(ArithmeticEnv(), TASKS)
    text_env.reset(seed=0, options={"index": 0})
    assert text_env.step("The answer is 5")[1:3] == (1.0, True)


# ---------------------------------------------------------------------------------------------
# (4) credit assignment: per_turn is per_episode for a single-turn run
# ---------------------------------------------------------------------------------------------


def test_per_turn_credit_equals_per_episode_credit_on_single_turn_groups() -> None:
    pytest.importorskip("trl")
    from trainers.grpo.advantages import advantage_estimator

    groups = collect_groups(ArithmeticEnv(), TASKS, Solver(wrong_every=3), episodes_per_task=4,
                            max_turns=1)  # fmt: skip
    raw = [[e.reward for e in g] for g in groups]
    turn_rewards = [[e.per_turn_rewards for e in g] for g in groups]
    assert all(t is None for g in turn_rewards for t in g)
    # Shaped rewards differ from the env's score (a reward function, a penalty): the two modes
    # still agree, because per-turn credit falls back to the episode's for every group.
    shaped = [[r + 0.1 * i for i, r in enumerate(g)] for g in raw]
    for scale in ("group", "batch", "none"):
        per_episode = advantage_estimator("per_episode")(shaped, turn_rewards, scale)
        per_turn = advantage_estimator("per_turn")(shaped, turn_rewards, scale)
        assert per_turn == per_episode
        assert any(a != 0.0 for g in per_episode.episode for a in g)
        # Why no per_turn_rewards=[score]: it would ignore the shaping and change the run.
        scored = advantage_estimator("per_turn")(shaped, [[[r] for r in g] for g in raw], scale)
        assert scored.turns != per_episode.turns


def test_per_turn_rewards_from_score_response_are_dropped_with_a_warning() -> None:
    class Chatty(ArithmeticEnv):
        def score_response(self, example, response_text):
            return RewardResult(score=1.0, metadata={"per_turn_rewards": [1.0], "length": 3})

    with pytest.warns(UserWarning, match="per_turn_rewards ignored"):
        [[episode]] = collect_groups(Chatty(), TASKS[:1], Solver(), max_turns=1)
    assert episode.per_turn_rewards is None and episode.metrics["length"] == 3


TRAIN_TASKS = [Task(prompt=f"What is {i} + {i}?", target=2 * i) for i in range(4)]


class EvenLength(ArithmeticEnv):
    """A reward the tiny random model varies on: the reply's length is even."""

    def score_response(self, example, response_text):
        return RewardResult(score=float(len(response_text) % 2 == 0), metadata={"chars": 1.0})


def _train(model_dir, output_dir, credit_assignment: str):
    import torch

    from trainers import GRPOConfig, train_multi_turn

    def brevity(prompts, completions, **kwargs):  # a TRL reward function on top of the env's
        return [-0.01 * len(c[-1]["content"]) for c in completions]

    config = GRPOConfig(
        output_dir=str(output_dir),
        model=str(model_dir),
        batch_size=2,
        episodes_per_task=4,
        num_steps=2,
        max_turns=1,
        max_model_length=256,
        max_tokens_per_turn=6,
        learning_rate=1e-2,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
        credit_assignment=credit_assignment,
    )
    trainer = train_multi_turn(
        config, tasks=TRAIN_TASKS, env_factory=EvenLength, reward_funcs=[brevity]
    )
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    logs = [
        {k: v for k, v in row.items() if k.startswith(("loss", "reward", "episodes/", "zero"))}
        for row in trainer.state.log_history
    ]
    assert trainer.state.global_step == 2
    return weights, logs, torch


def test_a_single_turn_run_is_identical_under_either_credit_mode(small_model_dir, tmp_path):
    """Two trainer steps, same seed: per_episode and per_turn give the same weights and logs."""
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    per_episode, logs_episode, torch = _train(small_model_dir, tmp_path / "a", "per_episode")
    per_turn, logs_turn, _ = _train(small_model_dir, tmp_path / "b", "per_turn")
    initial = AutoModelForCausalLM.from_pretrained(small_model_dir).state_dict()
    assert any(not torch.equal(per_episode[k], initial[k]) for k in initial)  # it trained
    assert per_episode.keys() == per_turn.keys()
    assert all(torch.equal(per_episode[k], per_turn[k]) for k in per_episode)
    assert logs_episode == logs_turn
    skipped = [row["zero_variance_skip_ratio"] for row in logs_episode if "loss" in row]
    assert len(skipped) == 2 and min(skipped) < 1.0  # the groups carried a signal


# ---------------------------------------------------------------------------------------------
# (5) sync and async hooks, (6) errors, odds and ends
# ---------------------------------------------------------------------------------------------


class AsyncArithmetic(ArithmeticEnv):
    async def build_prompt_messages(self, example, prompt_text):
        await asyncio.sleep(0)
        return [{"role": "user", "content": example.input}]

    async def score_response(self, example, response_text):
        await asyncio.sleep(0)
        return RewardResult(score=float(right_number(example, response_text)))


class AsyncBatched(ArithmeticEnv):
    async def score_responses(self, example, responses):
        await asyncio.sleep(0)
        return [float(right_number(example, r)) for r in responses]


def test_sync_and_async_hooks() -> None:
    for env in (AsyncArithmetic(), AsyncBatched(),
                single_turn_env_factory(ArithmeticEnv(), offload_hooks=True),
                single_turn_env_factory(AsyncArithmetic, offload_hooks=True)):  # fmt: skip
        groups = collect_groups(env, TASKS, Solver(wrong_every=2), episodes_per_task=2,
                                max_turns=1)  # fmt: skip
        assert [e.reward for g in groups for e in g] == [1.0, 0.0] * 3
    [[episode]] = collect_groups(AsyncArithmetic(), TASKS[:1], Solver(), max_turns=1)
    assert [m["role"] for m in episode.messages] == ["user", "assistant"]
    text_env = TextEnv(AsyncArithmetic, TASKS)
    text_env.reset(seed=0, options={"index": 0})
    assert text_env.step("5")[1:3] == (1.0, True)
    # the sync batch API over an async score_response
    example = TaskExample(input="What is 2 + 3?", output=5)
    assert [r.score for r in AsyncArithmetic().score_responses(example, ["5", "6"])] == [1.0, 0.0]
    shim = as_multi_turn(AsyncArithmetic())
    assert [r.score for r in shim.score_episodes(example, [_episode("6"), _episode("5")])] == [
        0.0, 1.0,
    ]  # fmt: skip


def test_clear_errors() -> None:
    class Unscored(EnvironmentSingleTurn):
        pass

    [[episode]] = collect_groups(Unscored(), TASKS[:1], Solver(), max_turns=1)
    assert "Unscored must implement score_response(example, response_text)" in episode.error
    with pytest.raises(NotImplementedError, match="score_response"):
        Unscored().score_response(TaskExample(input="x"), "y")

    class BadScore(ArithmeticEnv):
        def score_response(self, example, response_text):
            return {"score": 1.0}

    [[episode]] = collect_groups(BadScore(), TASKS[:1], Solver(), max_turns=1)
    assert "BadScore.score_response must return a RewardResult" in episode.error
    assert "{'score': 1.0}" in episode.error

    class BadPrompt(ArithmeticEnv):
        async def build_prompt_messages(self, example, prompt_text):
            return "What is 2 + 3?"

    [[episode]] = collect_groups(BadPrompt(), TASKS[:1], Solver(), max_turns=1)
    assert "BadPrompt.build_prompt_messages must return a list of message dicts" in episode.error
    assert "'What is 2 + 3?'" in episode.error

    class BadBatch(ArithmeticEnv):
        def score_responses(self, example, responses):
            return [1.0]

    groups = collect_groups(BadBatch(), TASKS[:1], Solver(), episodes_per_task=2, max_turns=1)
    assert all("BadBatch.score_responses must return a list of 2" in e.error for e in groups[0])

    with pytest.raises(InvalidArgumentError, match="EnvironmentSingleTurn instance"):
        as_multi_turn(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="must return an EnvironmentSingleTurn"):
        single_turn_env_factory(lambda: object()).environment_for()
    with pytest.raises(InvalidArgumentError, match="environment_kwargs"):
        single_turn_env_factory(ArithmeticEnv(), environment_kwargs={"split": "val"})
    with pytest.raises(InvalidArgumentError, match="EnvironmentSingleTurn, a subclass"):
        single_turn_env_factory(3)


def test_the_view_forwards_and_the_factory_pickles() -> None:
    env = ArithmeticEnv(split="val")
    shim = as_multi_turn(env)
    assert isinstance(shim, EnvironmentMultiTurn) and isinstance(shim, SingleTurnAsMultiTurn)
    assert (shim.dataset, shim.version, shim.tool_specs, shim.max_score_concurrency) == (
        ROWS[:1], "3", None, 8,
    )  # fmt: skip
    example = TaskExample(input="What is 2 + 3?", output=5)
    assert shim.max_episode_turns(example) == 1
    assert shim.step_episode(example, [], "5").final_response_text == "5"
    # SFT: the prompt comes from build_prompt_messages, the target from example.output
    prompt, target = sft_messages(shim, {"input": "What is 2 + 3?", "output": "5"}, "Add.")
    assert prompt[0]["content"] == "Add. Reply with the number."
    assert target == [{"role": "assistant", "content": "5"}]
    factory = single_turn_env_factory("tests.test_single_turn:load_environment", split="val")
    assert isinstance(factory, MultiTurnEnvFactory) and factory.__qualname__ == "load_environment"
    assert factory == single_turn_env_factory(
        "tests.test_single_turn:load_environment", split="val"
    )
    assert factory.environment_for().environment.split == "val"  # split= reaches the function
    assert single_turn_env_factory(ArithmeticEnv).environment_for().environment.split == "train"
    for clone in (pickle.loads(pickle.dumps(factory)), copy.deepcopy(factory)):
        assert clone == factory and clone.tasks() == [Task(prompt="What is 2 + 3?", target=5)]
    assert isinstance(as_env_factory(ArithmeticEnv), MultiTurnEnvFactory)
    assert isinstance(as_env_factory(env), MultiTurnEnvFactory)
    assert doctest.testmod(single_turn_module).failed == 0
    assert "EnvironmentSingleTurn" in llm_gym.environments.__all__
    assert [n for n in llm_gym.environments.__all__ if not hasattr(llm_gym.environments, n)] == []
