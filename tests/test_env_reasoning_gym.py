"""reasoning-gym as llm_gym environments: splits, seeding, the scorer, retry with feedback,
hostile answers, gym.make, the oracle and the evaluator.

The registry-wide tests (tests/test_registry.py) cover check_env, determinism, pickling and the
oracle and random floors of every id registered here; this file tests what is particular.
"""

from __future__ import annotations

import asyncio
import doctest
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("reasoning_gym")

import reasoning_gym

from llm_gym import InvalidArgumentError, Task, TruncationCause
from llm_gym.envs.reasoning_gym import (
    SPLIT_SIZES,
    SYSTEM_PROMPT,
    DatasetTasks,
    ReasoningGymEnv,
    dataset_names,
    get_tasks,
    oracle_action,
    parse_answer,
    score_answer,
)
from llm_gym.envs.reasoning_gym import env as env_module
from llm_gym.envs.reasoning_gym import tasks as tasks_module
from llm_gym.envs.reasoning_gym.env import MAX_ANSWER_CHARS
from llm_gym.envs.reasoning_gym.tasks import SPLIT_SEED_OFFSETS
from llm_gym.eval import run_and_report
from llm_gym.gym import env_entry
from llm_gym.policies import Generation, OraclePolicy, Policy, PolicyRequest
from llm_gym.rollout import collect_groups

FAMILIES = {
    "RG-BasicArithmetic-v0": "basic_arithmetic",
    "RG-ChainSum-v0": "chain_sum",
    "RG-SpellBackward-v0": "spell_backward",
    "RG-WordSorting-v0": "word_sorting",
    "RG-FamilyRelationships-v0": "family_relationships",
}
TINY_CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
"""chain_sum with two one-digit terms: 200 possible questions, so seeds alone would collide."""


def _play(task: Task, replies: Sequence[str]):
    """Feed ``replies`` to a fresh env until it ends; the last StepResult and the env."""
    env = ReasoningGymEnv()
    env.reset_sync(task)
    result = None
    for reply in replies:
        result = env.step_sync({"role": "assistant", "content": reply})
        if result.terminated or result.truncated:
            break
    return result, env


def _task(dataset: str, answer: str, metadata: dict | None = None, attempts: int = 1) -> Task:
    """A hand-made task: reasoning-gym's entry shape with our answer and metadata."""
    entry = {"question": "q?", "answer": answer, "metadata": metadata or {}}
    return Task("q?", answer, {"dataset": dataset, "entry": entry, "max_attempts": attempts})


# --- registration and import ----------------------------------------------------------------------


def test_import_llm_gym_does_not_import_reasoning_gym() -> None:
    code = (
        "import json, sys, gymnasium as gym, llm_gym, llm_gym.envs.reasoning_gym\n"
        "ids = sorted(i for i in gym.registry if i.startswith(('RG-', 'ReasoningGym')))\n"
        "before = 'reasoning_gym' in sys.modules\n"
        "env = gym.make('ReasoningGym-v0', dataset='chain_sum')\n"
        "dataset = env.reset(seed=0)[1]['task'].metadata['dataset']\n"
        "print(json.dumps([before, ids, dataset, 'reasoning_gym' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ids = sorted([*FAMILIES, "ReasoningGym-v0"])
    assert json.loads(out.stdout) == [False, ids, "chain_sum", True]


def test_catalogue_rows_system_prompt_and_doctests() -> None:
    for env_id, dataset in FAMILIES.items():
        entry = env_entry(env_id)
        assert entry.max_turns == 10 and entry.version == "0" and dataset in entry.description
        assert isinstance(entry.task_source(), DatasetTasks)
        assert entry.task_source().dataset == dataset
    assert env_entry("ReasoningGym-v0").tasks("test") == list(get_tasks("test"))
    assert reasoning_gym.utils.SYSTEM_PROMPTS["default"] == SYSTEM_PROMPT
    assert doctest.testmod(env_module).attempted > 0 and doctest.testmod(env_module).failed == 0


# --- splits and seeding ---------------------------------------------------------------------------


def test_without_partial_credit_only_an_accepted_answer_is_rewarded() -> None:
    """``partial_credit=False``: 1.0 for an accepted answer, 0.0 for one reasoning-gym gives
    partial credit, on every path that ends an episode (accepted, attempts used, cut short)."""
    tasks = get_tasks("val", dataset="chain_sum", config=TINY_CHAIN_SUM, partial_credit=False,
                      sizes={"train": 40, "val": 40, "test": 40})  # fmt: skip
    task = tasks[0]
    gold = str(task.target)
    assert task.metadata["partial_credit"] is False
    assert "partial_credit" not in get_tasks("val", dataset="chain_sum")[0].metadata
    reply = f"The sum is {gold}"
    assert _play(task, [gold])[0].reward == 1.0
    assert _play(task, [reply])[0].reward == 0.0
    with_credit = Task(task.prompt, task.target, {**task.metadata, "partial_credit": True})
    assert _play(with_credit, [reply])[0].reward == pytest.approx(len(gold) / len(reply))
    two = Task(task.prompt, task.target, {**task.metadata, "max_attempts": 2})
    result, env = _play(two, [reply])
    assert result.reward == 0.0 and not result.terminated  # a retry; nothing paid yet
    assert asyncio.run(env.conclude("max_turns")).reward == 0.0  # cut: the last answer's
    assert _play(two, [reply, reply])[0].reward == 0.0
    assert _play(two, [reply, gold])[0].reward == 1.0
    assert _play(two, [reply, reply])[1]._metrics()["first_score"] > 0  # metrics keep the score
    with pytest.raises(InvalidArgumentError, match="partial_credit must be true or false"):
        get_tasks("val", dataset="chain_sum", partial_credit="no")
    bad = Task(task.prompt, task.target, {**task.metadata, "partial_credit": 0})
    with pytest.raises(InvalidArgumentError, match=r"metadata\['partial_credit'\]"):
        ReasoningGymEnv().reset_sync(bad)


@pytest.mark.parametrize("dataset", sorted(FAMILIES.values()))
def test_splits_are_disjoint_sized_and_readable(dataset: str) -> None:
    splits = {split: get_tasks(split, dataset=dataset) for split in SPLIT_SIZES}
    questions = {split: [t.prompt for t in tasks] for split, tasks in splits.items()}
    for split, size in SPLIT_SIZES.items():
        assert len(questions[split]) == len(set(questions[split])) == size
        assert [t.id for t in splits[split]][:2] == [
            f"reasoning_gym/{dataset}/{split}/0",
            f"reasoning_gym/{dataset}/{split}/1",
        ]
    assert not set(questions["train"]) & set(questions["val"])
    assert not set(questions["train"]) & set(questions["test"])
    assert not set(questions["val"]) & set(questions["test"])
    task = splits["test"][17]
    assert task.id == f"reasoning_gym/{dataset}/test/17"
    assert task.target == task.metadata["entry"]["answer"] and task.metadata["max_attempts"] == 1
    # The task is reasoning-gym's own entry, from the test split's seed range.
    seed, index = task.metadata["rg_seed"], task.metadata["rg_index"]
    assert seed == tasks_module.TASK_SEED + SPLIT_SEED_OFFSETS["test"]
    assert (
        reasoning_gym.create_dataset(dataset, seed=seed, size=index + 1)[index]
        == (task.metadata["entry"])
    )


def test_a_small_family_is_deduplicated_across_and_within_splits() -> None:
    sizes = {"train": 100, "val": 40, "test": 40}
    options = dict(dataset="chain_sum", config=TINY_CHAIN_SUM, sizes=sizes)
    # Seeds alone would not keep them apart: the raw draws of the val and test seed ranges share
    # questions, and repeat questions inside one range.
    raw = {
        split: [
            e["question"]
            for e in reasoning_gym.create_dataset(
                "chain_sum", seed=tasks_module.TASK_SEED + SPLIT_SEED_OFFSETS[split], size=40,
                **TINY_CHAIN_SUM,
            )
        ]
        for split in ("val", "test")
    }  # fmt: skip
    assert set(raw["val"]) & set(raw["test"])
    assert len(set(raw["val"])) < 40
    questions = {s: [t.prompt for t in get_tasks(s, **options)] for s in sizes}
    for split, size in sizes.items():
        assert len(questions[split]) == len(set(questions[split])) == size
    assert not set(questions["train"]) & (set(questions["val"]) | set(questions["test"]))
    assert not set(questions["val"]) & set(questions["test"])
    # 200 questions exist: 40 + 40 + 121 cannot be drawn.
    with pytest.raises(
        InvalidArgumentError, match=r"gave only \d+ of 121 distinct questions for the 'train' split"
    ):
        get_tasks("train", **{**options, "sizes": {**sizes, "train": 121}})


def test_tasks_are_a_pure_function_of_their_options() -> None:
    code = (
        "import json; from llm_gym.envs.reasoning_gym import get_tasks\n"
        "tasks = get_tasks('val', dataset='word_sorting')\n"
        "print(json.dumps([[t.id, t.prompt, t.target] for t in tasks]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    tasks = get_tasks("val", dataset="word_sorting")
    assert json.loads(out.stdout) == [[t.id, t.prompt, t.target] for t in tasks]  # another process
    other = get_tasks("val", dataset="word_sorting", task_seed=7)
    assert not {t.prompt for t in other} & {t.prompt for t in tasks}
    # max_attempts changes the episodes, not the questions.
    three = get_tasks("val", dataset="word_sorting", max_attempts=3)
    assert [t.prompt for t in three] == [t.prompt for t in tasks]
    assert {t.metadata["max_attempts"] for t in three} == {3}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"dataset": "basic_arithmatic"}, "Did you mean 'basic_arithmetic'"),
        ({"dataset": 3}, "dataset must name a reasoning-gym dataset"),
        ({"dataset": "composite"}, "'composite' is not offered"),
        ({"max_attempts": 0}, r"max_attempts must be an int in \[1, 10\]"),
        ({"max_attempts": True}, "max_attempts must be an int"),
        ({"max_attempts": 11}, "max_attempts must be an int"),
        ({"task_seed": -1}, "task_seed must be an int"),
        ({"sizes": {"validation": 3}}, "sizes must be a dict from split"),
        ({"sizes": {"val": 0}}, r"sizes\['val'\] must be an int"),
        ({"config": {"seed": 1}}, "use the task_seed and sizes options"),
        ({"config": {"min_term": 2}}, "Its config fields: .*'min_terms'"),
        ({"config": {"min_terms": 0}}, "reasoning-gym refused config"),
        ({"config": {"min_terms": float("nan")}}, "config values must be JSON values"),
        ({"config": ["min_terms"]}, "config must be a dict"),
    ],
)
def test_bad_options_are_named_errors(options: dict, match: str) -> None:
    options = {"dataset": "chain_sum", **options}
    with pytest.raises(InvalidArgumentError, match=match):
        get_tasks("val", **options)


def test_unknown_dataset_lists_the_allowed_names() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        gym.make("ReasoningGym-v0", dataset="chain-sum")
    message = str(caught.value)
    assert "Did you mean 'chain_sum'?" in message and "'basic_arithmetic'" in message
    assert "Allowed: [" in message and str(list(dataset_names())) in message
    assert len(dataset_names()) >= 30 and "composite" not in dataset_names()
    with pytest.raises(InvalidArgumentError, match="Did you mean 'chain_sum'"):
        env_entry("ReasoningGym-v0").tasks("val", dataset="chain-sum")


# --- gym.make -------------------------------------------------------------------------------------


def test_gym_make_takes_the_dataset_as_a_keyword_or_a_task_option() -> None:
    by_keyword = gym.make("ReasoningGym-v0", dataset="chain_sum")
    by_option = gym.make("ReasoningGym-v0", task_options={"dataset": "chain_sum"})
    by_id = gym.make("RG-ChainSum-v0")
    tasks = [list(env.unwrapped.tasks("val")) for env in (by_keyword, by_option, by_id)]
    assert tasks[0] == tasks[1] == tasks[2] == list(get_tasks("val", dataset="chain_sum"))
    observation, info = by_keyword.reset(seed=0, options={"split": "val", "index": 5})
    assert info["task"].id == "reasoning_gym/chain_sum/val/5"
    assert observation.startswith(SYSTEM_PROMPT) and observation.endswith(info["task"].prompt)
    assert info["tool_specs"] == []
    default = gym.make("ReasoningGym-v0")
    assert default.unwrapped.tasks("test")[0].metadata["dataset"] == "basic_arithmetic"


def test_gym_make_refuses_an_option_twice_and_dataset_on_a_family_id() -> None:
    with pytest.raises(InvalidArgumentError, match="max_attempts was given twice"):
        gym.make("RG-ChainSum-v0", max_attempts=2, task_options={"max_attempts": 3})
    with pytest.raises(InvalidArgumentError, match=r"takes no option\(s\) \['dataset'\]"):
        gym.make("RG-ChainSum-v0", dataset="spell_backward")


def test_check_env_passes_with_retries_and_another_dataset() -> None:
    env = gym.make("ReasoningGym-v0", dataset="caesar_cipher", max_attempts=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []


# --- the scorer -----------------------------------------------------------------------------------


def test_the_reward_is_reasoning_gyms_score() -> None:
    task = _task("basic_arithmetic", "4")
    assert _play(task, ["<answer>4</answer>"])[0].reward == 1.0
    assert _play(task, ["<answer>5</answer>"])[0].reward == 0.0
    # basic_arithmetic keeps reasoning-gym's default scorer: an answer that contains the gold
    # one gets len(gold) / len(answer)
    assert _play(task, ["The answer is 4"])[0].reward == pytest.approx(1 / 15)
    assert _play(task, ["<answer>+04.0</answer>"])[0].reward == pytest.approx(1 / 5)
    # chain_sum's scorer compares numbers (sign, leading zeros, trailing decimals, commas)
    chain = _task("chain_sum", "4")
    assert _play(chain, ["<answer>+04.0</answer>"])[0].reward == 1.0
    assert _play(chain, ["<answer>4,000</answer>"])[0].reward == 1 / 4  # "4" in "4000"
    # word_sorting: the share of words in place, at least 0.2 for the right words in any order
    words = {"sorted_words": ["c", "b", "a"]}
    sorting = _task("word_sorting", "c, b, a", words)
    assert _play(sorting, ["<answer>c, b, a</answer>"])[0].reward == 1.0
    assert _play(sorting, ["<answer>c, a, b</answer>"])[0].reward == pytest.approx(1 / 3)
    assert _play(sorting, ["<answer>a, c, b</answer>"])[0].reward == pytest.approx(0.2)
    assert _play(sorting, ["<answer>c, b</answer>"])[0].reward == pytest.approx(2 / 3)


@pytest.mark.parametrize("dataset", sorted(FAMILIES.values()))
def test_rewards_equal_reasoning_gyms_scorer_on_real_tasks(dataset: str) -> None:
    scorer = reasoning_gym.get_score_answer_fn(dataset)
    for task in get_tasks("val", dataset=dataset)[:25]:
        gold = task.metadata["entry"]["answer"]
        for answer in (gold, gold[:-1], f"{gold}, x", "42", gold.upper(), ""):
            result, _ = _play(task, [f"<answer>{answer}</answer>"])
            assert result.reward == scorer(answer, task.metadata["entry"]), (dataset, answer)


def test_a_scorer_that_raises_is_a_zero_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_gym.envs.reasoning_gym import env as rg_env

    (task,) = get_tasks("val", dataset="word_sorting", sizes={"val": 1})

    def raising(dataset: str, config: str):
        def score(answer, entry):
            raise ValueError("not a list of words")

        return score

    monkeypatch.setattr(rg_env, "dataset_scorer", raising)
    error = score_answer("xyz", task.metadata["entry"], "word_sorting").error
    assert error.startswith("scorer raised ValueError")
    result, _ = _play(task, ["<answer>xyz</answer>"])
    assert result.reward == 0.0 and result.metrics["unscored"] == 1


@pytest.mark.parametrize("dataset", ["countdown", "puzzle24", "polynomial_multiplication"])
def test_a_scorer_that_could_run_the_answer_is_not_offered(dataset: str, tmp_path) -> None:
    """Some reasoning-gym scorers parse the answer with sympy (``eval``): such datasets are
    refused everywhere a scorer is reached, so a model's answer never runs as code."""
    marker = tmp_path / "ran"
    payload = f'__import__("pathlib").Path({str(marker)!r}).write_text("x")'
    with pytest.raises(InvalidArgumentError, match="not reviewed for hostile answers"):
        gym.make("ReasoningGym-v0", dataset=dataset)
    with pytest.raises(InvalidArgumentError, match="not reviewed for hostile answers"):
        get_tasks("val", dataset=dataset)
    entry = {"question": "q", "answer": "1", "metadata": {}}
    with pytest.raises(InvalidArgumentError, match="not reviewed for hostile answers"):
        score_answer(payload, entry, dataset)  # a hand-made task naming it is refused too
    assert not marker.exists()


def test_the_offered_datasets_score_with_the_base_or_a_reviewed_scorer() -> None:
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS

    from llm_gym.envs.reasoning_gym.tasks import REVIEWED_SCORERS, dataset_names

    offered = dataset_names()
    assert set(FAMILIES.values()) <= set(offered) and len(offered) >= 30
    for name in offered:
        base = DATASETS[name][0].score_answer is ProceduralDataset.score_answer
        assert base or name in REVIEWED_SCORERS, name
    assert "countdown" not in offered and "prime_factorization" not in offered


# --- answer extraction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", ("42", "tag")),
        ("I think 41. <answer>41</answer> no wait <answer> 42 </answer> done", ("42", "tag")),
        ("<think>maybe <answer>1</answer></think><answer>2</answer>", ("2", "tag")),
        ("<think>only thoughts <answer>1</answer></think> 7", ("7", "reply")),
        ("reasoning</think><answer>3</answer>", ("3", "tag")),
        ("<answer>a <answer>b</answer>", ("b", "tag")),
        ("work... <answer>12", ("12", "open_tag")),
        ("<answer></answer>", ("", "tag")),
        ("  just 9\n", ("just 9", "reply")),
        ("", ("", "reply")),
        ("9</answer>", ("9</answer>", "reply")),
    ],
)
def test_parse_answer(text: str, expected: tuple[str, str]) -> None:
    assert parse_answer(text) == expected


def test_parse_answer_is_linear_on_hostile_text() -> None:
    for text in ("<answer>" * 200_000, "</answer>" * 200_000, "<think>" * 200_000 + "<answer>1"):
        start = time.perf_counter()
        parse_answer(text)
        assert time.perf_counter() - start < 0.5


# --- retry with feedback --------------------------------------------------------------------------


def test_wrong_then_right_with_feedback() -> None:
    env = gym.make("RG-ChainSum-v0", max_attempts=3)
    _, info = env.reset(seed=0)
    gold = info["task"].target
    observation, reward, terminated, truncated, info = env.step("<answer>not a number</answer>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert observation == (
        "Your answer 'not a number' is not correct (reasoning-gym scored it 0.00 out of 1). "
        "Try again: 2 attempts left. Give your final answer as <answer>...</answer>."
    )
    observation, reward, terminated, truncated, info = env.step("nothing here <answer>")
    assert observation.startswith("No answer found in your reply. Try again: 1 attempt left.")
    observation, reward, terminated, truncated, info = env.step(f"<answer>{gold}</answer>")
    assert (observation, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["metrics"] == {
        "attempts": 3, "solved": 1.0, "first_score": 0.0, "tagged": 1.0, "unscored": 0,
    }  # fmt: skip


def test_the_final_answer_counts_not_the_best() -> None:
    task = _task("basic_arithmetic", "4", attempts=2)
    partial, _ = _play(task, ["The answer is 4", "<answer>5</answer>"])
    assert partial.terminated and partial.reward == 0.0
    assert partial.metrics["first_score"] == pytest.approx(1 / 15)
    assert partial.metrics["solved"] == 0.0 and partial.metrics["attempts"] == 2
    last_partial, _ = _play(task, ["<answer>5</answer>", "The answer is 4"])
    assert last_partial.reward == pytest.approx(1 / 15) and last_partial.metrics["tagged"] == 0.0
    one, env = _play(_task("basic_arithmetic", "4"), ["<answer>5</answer>"])
    assert one.terminated and one.reward == 0.0 and env.max_turns == 1
    assert [m["role"] for m in one.messages] == ["system", "user", "assistant"]


class Scripted(Policy):
    """A scripted policy: ``reply(request) -> text``."""

    def __init__(self, reply: Callable[[PolicyRequest], str]) -> None:
        self.reply = reply

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        return [Generation(text=self.reply(request)) for request in requests]


def wrong_then_oracle(request: PolicyRequest) -> str:
    if any(m["role"] == "assistant" for m in request.messages):
        return oracle_action(request.task, request.messages)["content"]
    return "<answer>-1</answer>"


def test_retry_through_the_rollout_loop_and_a_cut_episode_keeps_its_last_score() -> None:
    tasks = list(get_tasks("val", dataset="spell_backward", max_attempts=2)[:8])
    groups = collect_groups(ReasoningGymEnv, tasks, Scripted(wrong_then_oracle), max_turns=10)
    episodes = [e for group in groups for e in group]
    assert [(e.reward, e.num_turns, e.terminated) for e in episodes] == [(1.0, 2, True)] * 8
    assert "not correct" in episodes[0].turns[0].env_messages[0]["content"]
    # The run's turn limit (1) cuts a 3-attempt episode: the reward is its last answer's score.
    task = _task("basic_arithmetic", "4", attempts=3)
    says = Scripted(lambda request: "The answer is 4")
    (group,) = collect_groups(ReasoningGymEnv, [task], says, max_turns=1)
    assert group[0].truncation_cause == TruncationCause.MAX_TURNS
    assert group[0].reward == pytest.approx(1 / 15) and group[0].metrics["attempts"] == 1


# --- hostile answers ------------------------------------------------------------------------------


HOSTILE = {
    "empty": "",
    "tags only": "<answer></answer><answer>",
    "many openers": "<answer>" * 50_000,
    "control characters": "<answer>\x00\x1b[2J\u202e42</answer>",
    "lone surrogate": "<answer>\ud800</answer>",
    "huge number": f"<answer>{'9' * 5000}</answer>",
    "1e999999999": "<answer>1e999999999</answer>",
    "NaN": "<answer>NaN</answer>",
    "over the answer limit": "<answer>" + "1" * (MAX_ANSWER_CHARS + 1) + "</answer>",
    "1 MB": "a" * 1_000_000,
    "JSON tool call": '<tool_call>{"name": "x", "arguments": {}}</tool_call>',
}


@pytest.mark.parametrize("env_id", [*FAMILIES, "ReasoningGym-v0"])
def test_hostile_answers_are_outcomes(env_id: str) -> None:
    env = gym.make(env_id, max_attempts=2)
    for label, action in HOSTILE.items():
        env.reset(seed=1)
        start = time.perf_counter()
        for _ in range(2):
            observation, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert time.perf_counter() - start < 2.0, label
        assert terminated and not truncated and reward == 0.0, label
        assert isinstance(observation, str), label
    env.reset(seed=1)
    *_, truncated, info = env.step("a" * 1_000_001)  # over max_action_chars: the driver's rule
    assert truncated and info["truncation_cause"] == TruncationCause.PARSE_FAILURE


def test_over_long_answers_never_reach_the_scorer() -> None:
    (task,) = get_tasks("val", dataset="basic_arithmetic", sizes={"val": 1})
    gold = task.target
    padded = gold + " " * MAX_ANSWER_CHARS  # the scorer would accept it after stripping
    assert score_answer(padded, task.metadata["entry"], "basic_arithmetic").value == 0.0
    result, _ = _play(task, [f"<answer>{'x' * MAX_ANSWER_CHARS}{gold}</answer>"])
    assert result.reward == 0.0 and result.metrics["unscored"] == 1


def test_direct_callers_get_named_errors_and_tool_replies() -> None:
    env = ReasoningGymEnv()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step_sync({"role": "assistant", "content": "1"})
    with pytest.raises(InvalidArgumentError, match="dataset must name"):
        env.reset_sync(Task("q", "1"))
    with pytest.raises(InvalidArgumentError, match="needs metadata\\['entry'\\]"):
        env.reset_sync(Task("q", None, {"dataset": "chain_sum"}))
    with pytest.raises(InvalidArgumentError, match="max_attempts'\\] must be an int"):
        env.reset_sync(_task("chain_sum", "1", attempts=99))
    env.reset_sync(_task("chain_sum", "1", attempts=2))
    call = {"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}}
    result = env.step_sync({"role": "assistant", "content": None, "tool_calls": [call]})
    assert [m["role"] for m in result.messages[2:]] == ["assistant", "tool", "user"]
    assert result.messages[3]["tool_call_id"] == "c1" and not result.terminated
    result = env.step_sync({"role": "assistant", "content": "<answer>1</answer>"})
    assert result.terminated and result.reward == 1.0
    with pytest.raises(RuntimeError):
        env.step_sync({"role": "assistant", "content": "1"})


# --- the oracle and the evaluator -----------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["caesar_cipher", "gcd", "letter_counting", "leg_counting"])
def test_the_oracle_solves_other_datasets_too(dataset: str) -> None:
    for task in get_tasks("val", dataset=dataset, sizes={"val": 30}):
        assert _play(task, [oracle_action(task, [])["content"]])[0].reward == 1.0


def test_run_and_report_with_scripted_policies() -> None:
    random = run_and_report(
        "RG-WordSorting-v0", "random", episodes=40, progress=False, print_report=False
    )
    assert random.metrics["success_rate"] == 0.0
    retried = run_and_report(
        "RG-ChainSum-v0",
        Scripted(wrong_then_oracle),
        tasks=get_tasks("test", dataset="chain_sum", max_attempts=3)[:10],
        progress=False,
        print_report=False,
    )
    assert retried.metrics["success_rate"] == 1.0 and retried.metrics["turns_mean"] == 2.0
    oracle = run_and_report(
        "RG-ChainSum-v0", OraclePolicy(oracle_action), split="test", episodes=10, progress=False,
        print_report=False,
    )  # fmt: skip
    assert oracle.metrics["success_rate"] == 1.0 and oracle.metrics["turns_mean"] == 1.0


def test_the_guide_example() -> None:
    # The "Use with reasoning-gym" snippet of docs/guides/integrations.md, as it is written there.
    import gymnasium as gym

    import llm_gym  # noqa: F401  (registers the environments)
    from llm_gym.eval import run_and_report

    env = gym.make("ReasoningGym-v0", dataset="chain_sum", max_attempts=3)
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("<answer>0</answer>")
    print(observation)  # "Your answer '0' is not correct (...). Try again: 2 attempts left. ..."
    observation, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
    assert (reward, terminated) == (1.0, True)

    report = run_and_report("RG-WordSorting-v0", "oracle", episodes=40, progress=False)
    assert report.metrics["success_rate"] == 1.0 and report.tasks == 40
    assert report.metrics["reward_mean"] == 1.0 and report.env_version == "0"
