"""RFT (trainers.grpo.rejection_sampling): success judged by the environment, groups without a
success left to dynamic sampling, and GRPO's sampling budget; on hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from llm_gym import Task, TruncationCause
from llm_gym.actions import ParseKind
from llm_gym.eval.metrics import episode_succeeded
from llm_gym.rollout.episode import Episode, Turn
from trainers.grpo.advantages import advantage_estimator, shaped_reward
from trainers.grpo.dynamic_sampling import GroupPool, refill_tasks, varied_rewards
from trainers.grpo.rejection_sampling import (
    SUCCESS_REWARD,
    any_success,
    credit_rewards,
    group_signal,
    success_values,
)
from trainers.grpo.rewards import combined_rewards

RFT = SimpleNamespace(distillation=None, credit_assignment="rejection_sampling")
GRPO = SimpleNamespace(distillation=None, credit_assignment="per_episode")


def _episode(
    reward: float,
    metrics: dict | None = None,
    *,
    task: Task | None = None,
    index: int = 0,
    cause: TruncationCause | None = None,
) -> Episode:
    """A finished one-turn episode with the environment's ``reward`` and ``metrics``."""
    reply = {"role": "assistant", "content": "42"}
    return Episode(
        task=task or Task("q"),
        group=0,
        index=index,
        messages=[{"role": "user", "content": "q"}, reply],
        turns=[Turn("42", ParseKind.FINAL_ANSWER, reply)],
        reward=reward,
        terminated=cause is None,
        truncated=cause is not None,
        truncation_cause=cause,
        metrics=metrics or {},
        num_opening_messages=1,
    )


def _rft_advantages(groups: list[list[Episode]], shaped: list[list[float]]) -> list[list[float]]:
    """The advantages the trainer computes under RFT from the groups and their shaped rewards."""
    estimator = advantage_estimator("rejection_sampling")
    rewards = credit_rewards(RFT, groups, shaped)
    return estimator(rewards, [[None] * len(g) for g in groups], "group").episode


@pytest.mark.parametrize(
    ("reward", "metrics", "expected"),
    [
        (1.0, {}, True),  # the built-in envs' solved task
        (0.99, {}, False),
        (-1.0, {}, False),  # failed_parse_reward
        (0.4, {"success": True}, True),  # the env's flag decides: partial reward, but solved
        (1.0, {"success": False}, False),
        (1.0, {"success": 0}, False),  # a flag through JSON
        (0.0, {"success": 1.0}, True),
        (1.0, {"success": float("nan")}, True),  # no flag: the reward decides
        (0.0, {"success": float("nan")}, False),
        (0.0, {"success": 0.5}, False),
        (1.0, {"success": "no"}, True),
        (0.0, {"success": None}, False),
    ],
)
def test_episode_succeeded_reads_the_env_flag_then_its_reward(reward, metrics, expected) -> None:
    assert episode_succeeded(reward, metrics, SUCCESS_REWARD) is expected


def test_a_shaped_reward_over_the_threshold_does_not_make_a_failed_episode_a_success() -> None:
    # The env failed it (reward 0.0); a reward function adds 1.5: shaped 0.0 + 1.5 = 1.5 >= 1.0.
    failed, solved = _episode(0.0), _episode(1.0, index=1)

    def bonus(prompts, completions, **kwargs):
        return [1.5, 0.0]

    shaped, _ = combined_rewards([0.0, 1.0], [failed, solved], [bonus], [1.0])
    assert shaped == [1.5, 1.0]
    assert _rft_advantages([[failed, solved]], [shaped]) == [[0.0, 1.0]]


def test_an_env_success_that_shaping_pulled_below_the_threshold_is_kept() -> None:
    # A concluded episode the env scored 1.0 at the turn limit: the full overlong penalty
    # (1.0 - 1.0 = 0.0), then a length penalty of weight 0.5 on -0.4: 0.0 - 0.2 = -0.2.
    solved = _episode(1.0, cause=TruncationCause.MAX_TURNS)
    failed = _episode(0.0, index=1)
    penalised = shaped_reward(
        solved.reward,
        solved.truncation_cause,
        solved.total_tokens,
        max_model_length=2048,
        overlong_buffer=128,
        overlong_penalty_factor=1.0,
    )
    assert penalised == 0.0

    def length_penalty(prompts, completions, **kwargs):
        return [-0.4, 0.0]

    shaped, _ = combined_rewards([penalised, 0.0], [solved, failed], [length_penalty], [0.5])
    assert shaped == [-0.2, 0.0]
    assert _rft_advantages([[solved, failed]], [shaped]) == [[1.0, 0.0]]


def test_the_env_flag_decides_over_the_reward() -> None:
    partial = _episode(0.4, {"success": True})
    refused = _episode(1.0, {"success": False}, index=1)
    assert success_values([[partial, refused]]) == [[1.0, 0.0]]
    assert _rft_advantages([[partial, refused]], [[0.4, 1.0]]) == [[1.0, 0.0]]


def test_a_mixed_group_keeps_only_its_successes() -> None:
    group = [_episode(1.0), _episode(0.0, index=1), _episode(-1.0, index=2), _episode(1.0, index=3)]
    pool = GroupPool(wanted=1, signal=group_signal(RFT))
    pool.add(group, [1.0, 0.0, -1.0, 1.0])
    assert pool.deficit == 0 and pool.zero_variance == 0
    groups, shaped = pool.batch()
    assert _rft_advantages(groups, shaped) == [[1.0, 0.0, 0.0, 1.0]]


def test_an_all_failed_group_is_set_aside_for_dynamic_sampling() -> None:
    # Its shaped rewards vary (a parse failure at -1.0), so GRPO trains on it; RFT has nothing
    # to imitate in it: a spare, and the batch still lacks a group.
    failed = [_episode(0.0), _episode(-1.0, index=1, cause=TruncationCause.PARSE_FAILURE)]
    solved = [_episode(1.0), _episode(1.0, index=1)]
    rft, grpo = GroupPool(1, signal=group_signal(RFT)), GroupPool(1, signal=group_signal(GRPO))
    for pool in (rft, grpo):
        pool.add(failed, [0.0, -1.0])
    assert (rft.deficit, rft.zero_variance) == (1, 1)
    assert (grpo.deficit, grpo.zero_variance) == (0, 0)
    # A group that succeeded every time is RFT's strongest signal, and none for GRPO.
    rft.add(solved, [1.0, 1.0])
    assert rft.deficit == 0 and rft.batch()[0] == [solved]  # the failed group is not trained on
    assert group_signal(GRPO) is varied_rewards and group_signal(RFT) is any_success
    distill = SimpleNamespace(distillation="teacher", credit_assignment="rejection_sampling")
    assert group_signal(distill)(failed, [0.0, 0.0])  # a per-token signal in every group


def test_the_estimator_refuses_shaped_rewards() -> None:
    estimator = advantage_estimator("rejection_sampling")
    assert estimator([[1.0, 0.0], [0.0]], [[None, None], [None]], "group").episode == [
        [1.0, 0.0],
        [0.0],
    ]
    with pytest.raises(ValueError, match=r"rewards\[0\]\[1\] is 0.5.*success_values"):
        estimator([[1.0, 0.5]], [[None, None]], "none")
    assert credit_rewards(GRPO, [[_episode(0.0)]], [[1.5]]) == [[1.5]]  # GRPO: shaped rewards


def test_the_config_takes_it() -> None:
    from trainers import GRPOConfig

    config = GRPOConfig(
        output_dir="/tmp/unused", max_turns=2, episodes_per_task=2,
        credit_assignment="rejection_sampling",
    )  # fmt: skip
    assert config.credit_assignment == "rejection_sampling"
    with pytest.raises(ValueError, match="rejection_sampling"):
        GRPOConfig(output_dir="/tmp/unused", max_turns=2, credit_assignment="rejection")


# --- the trainer's dynamic sampling: GRPO's budget -------------------------------------------


FAILS, MIXED, SOLVED = [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]


@pytest.fixture(scope="module")
def scripted_trainer(small_model_dir, tmp_path_factory):
    """A trainer on the small test model whose collections are scripted (no model runs): set
    ``trainer.outcomes[i]``, the env rewards of the episodes of task ``i``, and
    ``trainer.args.credit_assignment``; ``trainer.collected`` records the tasks collected."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("rft")),
        model=str(small_model_dir),
        batch_size=2,
        episodes_per_task=2,
        max_turns=2,
        max_sampling_attempts=3,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        num_steps=1,
    )
    tasks = [Task(f"task {i}", id=str(i)) for i in range(2)]
    trainer = MultiTurnGRPOTrainer(args=args, env_factory=ToolUseGameEnv, tasks=tasks)

    def collect(tasks, *, episodes_per_task, temperature, max_turns, sequential=False, **mixture):
        trainer.collected.extend(int(task.id) for task in tasks)
        return [
            [_episode(r, task=task, index=e) for e, r in enumerate(trainer.outcomes[int(task.id)])]
            for task in tasks
        ]

    trainer.collect = collect
    return trainer


def _draw(trainer, credit_assignment: str, outcomes: list[list[float]], first: list[int]):
    """The tasks the trainer collects for one batch that starts with the tasks ``first``, and
    its pool, when the episodes of task ``i`` get the env rewards ``outcomes[i]``."""
    trainer.args.credit_assignment = credit_assignment
    trainer.outcomes, trainer.collected = outcomes, []
    trainer.tasks = [Task(f"task {i}", id=str(i)) for i in range(len(outcomes))]
    inputs = [{"task_index": i} for i in first for _ in range(2)]
    from trainers.grpo.collection import lockstep_pool

    return trainer.collected, lockstep_pool(trainer, inputs, wanted=len(first))


def test_rft_resamples_an_all_failed_group_with_grpos_budget(scripted_trainer) -> None:
    # Tasks 0 and 3 always fail, the others succeed once in two: GRPO's zero-variance groups
    # are exactly RFT's groups without a success, so with the same seeds both draw the same
    # tasks, groups and episodes.
    outcomes = [FAILS, MIXED, MIXED, FAILS, MIXED, MIXED]
    pools, drawn = {}, {}
    for name in ("per_episode", "rejection_sampling"):
        drawn[name], pools[name] = _draw(scripted_trainer, name, outcomes, [0, 1])
    # Round 1 draws tasks 0 and 1; task 0 failed every time, so each later round refills one
    # group with refill_tasks(tasks, 1, (task_seed 0, step 0, attempt, rank 0)): task 3 at
    # attempt 1 (it fails again), task 4 at attempt 2 (mixed: the batch is full).
    assert [refill_tasks(list(range(6)), 1, (0, 0, attempt, 0)) for attempt in (1, 2)] == [[3], [4]]
    assert drawn["per_episode"] == drawn["rejection_sampling"] == [0, 1, 3, 4]
    rft, grpo = pools["rejection_sampling"], pools["per_episode"]
    assert rft.collected == grpo.collected == 4 and rft.deficit == grpo.deficit == 0
    groups, shaped = rft.batch()
    assert [g[0].task.id for g in groups] == ["1", "4"]  # the all-failed groups are not trained on
    assert [g[0].task.id for g, _ in rft.spare] == ["0", "3"]
    assert _rft_advantages(groups, shaped) == [[1.0, 0.0], [1.0, 0.0]]


def test_rft_keeps_a_group_that_always_succeeded_and_never_draws_more(scripted_trainer) -> None:
    # Task 0 succeeds every time: GRPO sets it aside (zero variance) and refills, RFT trains on
    # it. GRPO refills task 3 (fails) at attempt 1 and task 0 at attempt 2, and its third round
    # ends the budget with the batch one group short; RFT's batch is full after round 1.
    outcomes = [SOLVED, MIXED, FAILS, FAILS]
    assert [refill_tasks(list(range(4)), 1, (0, 0, attempt, 0)) for attempt in (1, 2)] == [[3], [0]]
    grpo_tasks, grpo = _draw(scripted_trainer, "per_episode", outcomes, [0, 1])
    rft_tasks, rft = _draw(scripted_trainer, "rejection_sampling", outcomes, [0, 1])
    assert grpo_tasks == [0, 1, 3, 0] and (grpo.collected, grpo.deficit) == (4, 1)
    assert rft_tasks == [0, 1] and (rft.collected, rft.deficit) == (2, 0)
    groups, shaped = rft.batch()
    assert _rft_advantages(groups, shaped) == [[1.0, 1.0], [1.0, 0.0]]


def _async_take(credit_assignment: str, script: list[list[float]], wanted: int):
    """Async dynamic sampling (``AsyncCollector.take``, ``max_sampling_attempts=2``) over a
    worker that hands out groups with the env rewards of ``script`` in order: the groups taken,
    and the pool."""
    from trainers.async_rl.collect import AsyncCollector

    queue = [[_episode(r, index=e) for e, r in enumerate(rewards)] for rewards in script]

    def take(need: int):
        groups = [(0, queue.pop(0)) for _ in range(need)]  # (start version, episodes)
        return groups, 0.0

    collector = AsyncCollector.__new__(AsyncCollector)  # its worker only: no generators
    collector.args = SimpleNamespace(
        max_steps_off_policy=1, max_sampling_attempts=2, distillation=None,
        credit_assignment=credit_assignment,
    )  # fmt: skip
    collector.version, collector.worker = 0, SimpleNamespace(take=take)
    batch = collector.take(wanted, lambda episodes: [e.reward for e in episodes])
    return batch.taken, batch.pool


def test_async_batches_refill_all_failed_groups_within_the_same_budget() -> None:
    # Budget: 2 groups x 2 attempts = 4. After [FAILS, MIXED] one group is missing; both refill
    # one at a time: FAILS, then FAILS again, and the budget is spent.
    script = [FAILS, MIXED, FAILS, FAILS, MIXED]
    grpo_taken, grpo = _async_take("per_episode", list(script), wanted=2)
    rft_taken, rft = _async_take("rejection_sampling", list(script), wanted=2)
    assert grpo_taken == rft_taken == 4 and rft.zero_variance == grpo.zero_variance == 3
    # A group that succeeded every time fills RFT's batch; GRPO spends its budget.
    script = [SOLVED, MIXED, FAILS, FAILS]
    assert _async_take("rejection_sampling", list(script), wanted=2)[0] == 2
    assert _async_take("per_episode", list(script), wanted=2)[0] == 4
