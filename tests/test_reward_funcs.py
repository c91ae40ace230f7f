"""The trainer's extra rewards and task draw: the config's ``judge`` (a scripted judge endpoint
on loopback) adds its weighted score to each episode's reward and logs its counters, a failing
judge only falls back; ``difficulty_sampling`` draws the step's tasks by estimate and logs
what it saved. On the small test model, a couple of steps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_judge import ScriptedEndpoint, reply

pytest.importorskip("torch")

RUBRIC = [{"name": "answered", "question": "Did the assistant give a final answer?"}]


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    server = ScriptedEndpoint()
    yield server
    server.close()


def trainer_with(model_dir: Any, output_dir: str, **config: Any) -> Any:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=output_dir, model=str(model_dir), batch_size=2, episodes_per_task=2,
        max_turns=2, max_model_length=1024, max_tokens_per_turn=16, use_cpu=True,
        save_strategy="no", logging_steps=1, **config,
    )  # fmt: skip
    return MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:4])
    )


def test_the_judge_adds_its_weighted_score_per_group(small_model_dir, tmp_path, endpoint) -> None:
    def grade(body: dict[str, Any]) -> tuple[int, Any]:  # attempt 1 answered, attempt 2 not
        return 200, reply(json.dumps({"1": {"answered": True}, "2": {"answered": False}}))

    endpoint.respond = grade
    judge = {"base_url": endpoint.url, "model": "judge", "rubric": RUBRIC, "mode": "group",
             "weight": 0.5, "cache_size": 0}  # fmt: skip
    trainer = trainer_with(small_model_dir, str(tmp_path), judge=judge, num_steps=1)
    [group] = trainer.collect(trainer.tasks[:1], episodes_per_task=2, temperature=1.0, max_turns=2)
    rewards = trainer.group_rewards(group)
    shaped = [trainer.rewards.shaped(e) for e in group]
    assert rewards == pytest.approx([shaped[0] + 0.5, shaped[1]])  # one request for the group
    assert len(endpoint.requests) == 1 and "Attempt 2" in str(endpoint.requests[0]["body"])
    judged = trainer.rewards.judge_metrics()
    assert judged["judge/requests"] == 1.0 and judged["judge/failures"] == 0.0


def test_a_failing_judge_falls_back_and_training_goes_on(
    small_model_dir, tmp_path, endpoint
) -> None:
    endpoint.respond = lambda body: (503, {"error": "overloaded"})
    judge = {"base_url": endpoint.url, "model": "judge", "rubric": RUBRIC, "max_retries": 0,
             "fallback": -0.25, "timeout_s": 5}  # fmt: skip
    trainer = trainer_with(
        small_model_dir, str(tmp_path), judge=judge, num_steps=2, difficulty_sampling={}
    )
    trainer.train()
    logs = [record for record in trainer.state.log_history if "judge/failures" in record]
    assert len(logs) == 2 and all(r["judge/failure_ratio"] == 1.0 for r in logs)
    assert all(r["judge/failures"] == 4 for r in logs)  # 2 groups x 2 episodes a step
    assert all(r["rewards/judge/mean"] == -0.25 for r in logs)
    assert all("difficulty/zero_variance_saved" in r for r in logs)
    assert logs[0]["difficulty/tasks_seen"] == 0 and logs[1]["difficulty/tasks_seen"] >= 1
    from tests.test_async import undocumented_metrics

    assert not undocumented_metrics({k for r in trainer.state.log_history for k in r})
    estimates = [trainer.difficulty.estimate(i) for i in range(4)]
    assert sum(e is not None for e in estimates) >= 2
