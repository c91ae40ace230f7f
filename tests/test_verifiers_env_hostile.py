"""Hostile rewards from a verifiers taskset played in llm_gym's loop
(:mod:`llm_gym.integrations.verifiers.env`): each is an episode outcome, never a crash, and no
reward that is not a finite number reaches the trainer or a report.

==========================  =========================================  =========================
case                        without a fix                              what holds
==========================  =========================================  =========================
a reward of NaN             (contained, now tested) the step's reward  the episode ends as ENV
                            is refused as not finite                   with the error, reward 0
a reward of +inf            (contained, now tested) the same           the same
an int reward of 10**400    (contained, now tested) verifiers' float   the same
                            conversion overflows inside its scoring
a reward that raises        (contained, now tested) verifiers'         the same
                            scoring boundary records a TaskError
a reward returned as the    (contained, now tested) verifiers reads    scored as 1.0, the
string ``"1.0"``            it as the number 1.0                       weighted sum as usual
==========================  =========================================  =========================
"""

from __future__ import annotations

from typing import Any

import pytest

vf = pytest.importorskip("verifiers.v1")

from llm_gym import Task  # noqa: E402
from llm_gym.core.env import TruncationCause  # noqa: E402
from llm_gym.policies.scripted import OraclePolicy  # noqa: E402
from llm_gym.rollout import collect_groups  # noqa: E402
from tests.test_integration_verifiers import QAData, QATask, qa_oracle  # noqa: E402


def _taskset(score: Any) -> Any:
    """A one-task taskset whose ``exact`` reward is ``score`` (the others as in QATask)."""

    class Hostile(QATask):
        @vf.reward
        async def exact(self, task, trace) -> float:
            if isinstance(score, BaseException):
                raise score
            return score

    class HostileSet(vf.Taskset[Hostile, vf.TasksetConfig]):
        def load(self):
            yield Hostile(QAData(prompt="What is 2 + 2?", answer="4"))

    return HostileSet(vf.TasksetConfig())


def _play(score: Any) -> Any:
    task = Task("What is 2 + 2?", {"answer": "4"})
    [[episode]] = collect_groups(_taskset(score), [task], OraclePolicy(qa_oracle), max_turns=2)
    return episode


@pytest.mark.parametrize(
    ("score", "message"),
    [
        (float("nan"), "reward=nan; a reward must be a finite number"),
        (float("inf"), "reward=inf; a reward must be a finite number"),
        (10**400, "OverflowError"),
        (RuntimeError("scorer broke"), "RuntimeError: scorer broke"),
    ],
    ids=["nan", "inf", "huge int", "raises"],
)
def test_a_reward_that_is_no_finite_number_ends_only_its_episode(score, message) -> None:
    episode = _play(score)
    assert episode.truncation_cause is TruncationCause.ENV
    assert episode.reward == 0.0 and message in episode.error


def test_a_numeric_string_reward_is_read_as_its_number() -> None:
    episode = _play("1.0")
    assert episode.error is None
    assert episode.reward == 1.5 and episode.metrics["exact"] == 1.0  # 1.0 + 0.5 x digits_only
