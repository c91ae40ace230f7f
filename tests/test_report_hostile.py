"""Hostile counts for ``run_and_report`` (:mod:`llm_gym.eval.report`) and ``llm-gym eval``.

==========================  =========================================  =========================
case                        without a fix                              what holds
==========================  =========================================  =========================
``k`` of 10**12             every episode of the collection was        refused before the policy
                            scheduled at once: MemoryError after a     is built or any episode
                            minute (or the OOM killer)                 made, naming
                                                                       MAX_EVAL_EPISODES
``llm-gym eval --k`` past   the same, as a traceback                   one line, exit code 2
the limit
``episodes`` of 10**12      (contained, now tested) every task of the  the same
with k = 1                  split once, as documented
==========================  =========================================  =========================
"""

from __future__ import annotations

import time

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import run_and_report
from llm_gym.eval.report import MAX_EVAL_EPISODES


def test_a_huge_k_is_refused_before_the_policy_or_any_episode() -> None:
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="MAX_EVAL_EPISODES") as caught:
        # a model spec that would fail to load: the count is judged first
        run_and_report("GuessNumber-v0", "hf:/no/such/model", k=10**12, print_report=False)
    assert time.perf_counter() - start < 10
    assert f"{10**12:,}" in str(caught.value)


def test_the_limit_counts_tasks_times_k() -> None:
    k = MAX_EVAL_EPISODES // 2 + 1  # two tasks of k episodes pass the limit, one does not
    with pytest.raises(InvalidArgumentError, match="lower k or episodes"):
        run_and_report("GuessNumber-v0", "random", episodes=2 * k, k=k, print_report=False)


def test_cli_eval_with_a_huge_k_is_one_line(capsys) -> None:
    from llm_gym.cli import main

    assert main(["eval", "GuessNumber-v0", "--policy", "random", "--k", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym eval: error: ") and "MAX_EVAL_EPISODES" in err
    assert err.count("\n") == 1


def test_more_episodes_than_tasks_plays_every_task_once() -> None:
    report = run_and_report(
        "GuessNumber-v0", "random", episodes=10**12, progress=False, print_report=False
    )
    assert report.tasks == len(report.episodes) > 0
