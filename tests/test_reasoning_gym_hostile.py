"""reasoning-gym's generators under hostile task options (:mod:`llm_gym.envs.reasoning_gym.
generation` and the task source of ``tasks``): configs that make reasoning-gym's own code run for
minutes or without end, a dataset that cannot be built in time, a generator that dies, splits
too large to generate. Each is refused within the time limit, naming the dataset, the config
and the limit, and the child process that ran it is gone; the tasks themselves are those
reasoning-gym generates in this process.

==============================  ========================================  =====================
case                            without a fix                             what holds
==============================  ========================================  =====================
``basic_arithmetic`` with       gym.make / reset / the task source ran    refused after
``max_digits=2000``             reasoning-gym's divisor loop (up to the   ``generation_timeout_
                                square root of a 2,000-digit number) and  s``, the child killed
                                never returned
a dataset whose build hangs     the config check hung                     refused after the
                                                                          limit
a generator process that dies   (contained)                               a named error with
                                                                          its exit code
``sizes`` past                  accepted up to 1,000,000 a split: minutes refused before
``MAX_SPLIT_SIZE``              of generation and gigabytes of entries    anything is generated
==============================  ========================================  =====================
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym

from llm_gym import InvalidArgumentError
from llm_gym.envs.reasoning_gym import generation, get_tasks
from llm_gym.envs.reasoning_gym import tasks as tasks_module
from llm_gym.envs.reasoning_gym.tasks import MAX_SPLIT_SIZE

LIMIT_S = 1.0
"""The generation time limit these tests set (the default is GENERATION_TIMEOUT_S)."""
HANGING = {"max_digits": 2000}
"""basic_arithmetic's divisor loop over 2,000-digit numbers: minutes an entry, at least."""
needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="the child inherits this test's patch of reasoning-gym only when forked",
)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s outcome, or a failure when it runs past ``seconds``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def no_children_left() -> bool:
    return not multiprocessing.active_children()


def test_a_config_whose_generator_never_ends_is_refused_within_the_limit() -> None:
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError) as caught:
        within(20, lambda: get_tasks("test", config=HANGING, generation_timeout_s=LIMIT_S))
    message = str(caught.value)
    assert "'basic_arithmetic' took over 1 s to generate one entry" in message
    assert '{"max_digits": 2000}' in message and "generation_timeout_s=1" in message
    assert time.monotonic() - started < 10
    assert no_children_left()


@pytest.mark.parametrize("env_id", ["ReasoningGym-v0", "RG-BasicArithmetic-v0"])
def test_gym_make_and_reset_with_a_hanging_config_are_refused_within_the_limit(
    env_id: str,
) -> None:
    def make_and_reset() -> None:
        env = gym.make(env_id, config=HANGING, generation_timeout_s=LIMIT_S)
        env.reset(seed=0)

    with pytest.raises(InvalidArgumentError, match="took over 1 s to generate one entry"):
        within(20, make_and_reset)
    assert no_children_left()


@needs_fork
def test_a_dataset_whose_build_hangs_is_refused_within_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda *a, **k: time.sleep(600))
    with pytest.raises(InvalidArgumentError, match=r"'chain_sum' took over 1 s to build the "):
        within(20, lambda: get_tasks("val", dataset="chain_sum", config={"min_terms": 3},
                                     generation_timeout_s=LIMIT_S))  # fmt: skip
    assert no_children_left()


@needs_fork
def test_a_generator_process_that_dies_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda *a, **k: os._exit(7))
    with pytest.raises(InvalidArgumentError, match=r"ended without its entries \(exit code 7\)"):
        within(20, lambda: list(generation.generate_entries("gcd", "{}", seed=3, size=5)))


def test_sizes_past_the_maximum_are_refused_before_any_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_generation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("generated")

    monkeypatch.setattr(tasks_module, "generate_entries", no_generation)
    too_many = {"train": MAX_SPLIT_SIZE + 1}
    with pytest.raises(InvalidArgumentError, match=r"sizes\['train'\] must be an int in \[1, "):
        get_tasks("train", dataset="gcd", sizes=too_many, task_seed=5)
    assert MAX_SPLIT_SIZE <= 100_000


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "5", 601])
def test_a_bad_generation_timeout_is_a_named_error(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"generation_timeout_s must be a number"):
        get_tasks("val", dataset="gcd", generation_timeout_s=value)


def test_the_tasks_are_the_entries_reasoning_gym_generates_in_this_process() -> None:
    """The reference: each task's entry, generated here from its seed and index."""
    options = {"dataset": "chain_sum", "task_seed": 11, "sizes": {"val": 30, "test": 30}}
    tasks = get_tasks("val", **options, generation_timeout_s=LIMIT_S)
    assert len(tasks) == 30 and no_children_left()
    for task in tasks:
        seed, index = task.metadata["rg_seed"], task.metadata["rg_index"]
        here = reasoning_gym.create_dataset("chain_sum", seed=seed, size=30)[index]
        assert task.metadata["entry"] == here and task.prompt == here["question"]
    # The time limit is not part of the tasks: another limit, the same tasks.
    assert get_tasks("val", **options) == tasks


def test_a_caller_that_stops_early_stops_the_child() -> None:
    draws = generation.generate_entries("gcd", "{}", seed=1, size=100_000, chunks=10)
    first = [next(draws) for _ in range(3)]
    assert [index for _, index, _ in first] == [0, 1, 2]
    draws.close()
    assert no_children_left()
