"""A mixture of environments: the stratified draw by hand, its resume, the records' refusals,
the per-environment metrics, and a short training run on five environments with the small
model (per-env metrics and validation, a checkpoint and a resume that continues the draw)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.episode import Episode
from trainers.grpo.metrics import env_metrics
from trainers.mixture.env import (
    MixtureDraw,
    MixtureEnv,
    check_mixture,
    load_mixture_state,
    refill_slots,
    save_mixture_state,
    stratified_slots,
)

# --- the draw -----------------------------------------------------------------------------------


def test_stratified_slots_by_hand() -> None:
    # shares 3/4, 1/4: slot 0 both behind, deadlines 4/3 vs 4 -> 0; slot 1 deadlines 8/3, 4 ->
    # 0; slot 2 deadlines 4, 4 (tie, first) -> 0; slot 3: env 0 has its 3 of 3 -> 1
    assert stratified_slots([3, 1], [0, 0], 8) == [0, 0, 0, 1, 0, 0, 0, 1]
    # shares 1/2, 1/4, 1/4: each quarter-share env every other step of two groups
    assert stratified_slots([2, 1, 1], [0, 0, 0], 4) == [0, 1, 0, 2]
    # 0.1 and 0.3 are exact decimal shares (1/4, 3/4), as 1 and 3
    assert stratified_slots([0.1, 0.3], [0, 0], 8) == stratified_slots([1, 3], [0, 0], 8)


def test_a_small_weight_appears_in_every_stratum_of_its_size() -> None:
    # 1/20 at 4 groups a step: env 0 is behind its share only at slot 19 (20 x 1/20 = 1), then 39
    slots = stratified_slots([1, 19], [0, 0], 40)
    per_step = [slots[4 * s : 4 * s + 4].count(0) for s in range(10)]
    assert per_step == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1]


def test_every_env_stays_within_one_slot_of_its_share() -> None:
    rng = random.Random(0)
    for _ in range(200):
        weights = [rng.choice([rng.random() + 0.01, rng.randint(1, 9), 0.01]) for _ in range(5)]
        total = sum(weights)
        drawn = [0] * 5
        for n, env in enumerate(stratified_slots(weights, drawn, 200), start=1):
            drawn[env] += 1
            assert all(abs(n * w / total - d) < 1 for w, d in zip(weights, drawn, strict=True))


def test_a_draw_resumed_at_its_position_continues_the_same_sequence() -> None:
    whole = MixtureDraw([2, 1, 1], [3, 2, 2], seed=7).take(12)
    first = MixtureDraw([2, 1, 1], [3, 2, 2], seed=7)
    assert first.take(5) == whole[:5] and first.position == 5
    assert MixtureDraw([2, 1, 1], [3, 2, 2], seed=7, position=5).take(7) == whole[5:]
    # the envs of the pairs are the stratified slots; each env's tasks a permutation per epoch
    assert [env for env, _ in whole] == stratified_slots([2, 1, 1], [0, 0, 0], 12)
    assert sorted(task for env, task in whole[:6] if env == 0) == [0, 1, 2]


def test_processes_take_disjoint_strided_shares_of_one_sequence() -> None:
    whole = MixtureDraw([2, 1, 1], [3, 2, 2], seed=1).take(8)
    ranks = [MixtureDraw([2, 1, 1], [3, 2, 2], seed=1, rank=r, world=2).take(4) for r in (0, 1)]
    assert ranks[0] == whole[0::2] and ranks[1] == whole[1::2]


def test_refills_are_seeded_and_by_weight() -> None:
    picks = refill_slots([1, 0.001], [5, 5], 50, (0, 1, 1, 0))
    assert picks == refill_slots([1, 0.001], [5, 5], 50, (0, 1, 1, 0))
    assert sum(env == 0 for env, _ in picks) >= 45 and all(0 <= t < 5 for _, t in picks)


def test_the_mixture_state_round_trips_and_refuses_another_mixture(tmp_path) -> None:
    save_mixture_state(tmp_path, 0, 12, ["a", "b"], [2.0, 1.0])
    assert load_mixture_state(tmp_path, 0, ["a", "b"], [2.0, 1.0]) == 12
    assert load_mixture_state(tmp_path, 1, ["a", "b"], [2.0, 1.0]) is None  # none for rank 1
    with pytest.raises(InvalidArgumentError, match="same envs and weights"):
        load_mixture_state(tmp_path, 0, ["a", "b"], [1.0, 1.0])
    (tmp_path / "mixture_state-0.json").write_text("{")
    with pytest.raises(InvalidArgumentError, match="not a mixture state"):
        load_mixture_state(tmp_path, 0, ["a", "b"], [2.0, 1.0])


def test_the_resumed_async_order_starts_at_the_saved_position(tmp_path) -> None:
    from trainers.mixture.run import MixtureRun

    envs = [_env("a", 2, 3), _env("b", 1, 2)]
    run = MixtureRun(envs, SimpleNamespace(task_seed=3))
    save_mixture_state(tmp_path, 0, 4, run.names, run.weights)
    run.resume(str(tmp_path), output_dir=str(tmp_path))
    order = run.async_order()
    expected = MixtureDraw([2, 1], [3, 2], seed=3).take(7)[4:]
    assert [next(order) for _ in range(3)] == [run.offsets[e] + t for e, t in expected]
    assert run.position == 7


# --- records ------------------------------------------------------------------------------------


def _env(name: str, weight: float, tasks: int = 2, **kwargs) -> MixtureEnv:
    return MixtureEnv(
        name=name,
        env_factory="llm_gym.envs.guess_number:GuessNumberEnv",
        tasks=[Task(prompt=f"{name}{i}") for i in range(tasks)],
        weight=weight,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"weight": 0}, "weight must be a number > 0"),
        ({"weight": -1.0}, "weight must be a number > 0"),
        ({"weight": True}, "weight must be a number > 0"),
        ({"weight": float("nan")}, "weight must be a number > 0"),
        ({"weight": float("inf")}, "finite"),
        ({"max_turns": 0}, "max_turns must be an integer >= 1"),
        ({"val_max_turns": 1.5}, "val_max_turns must be an integer >= 1"),
    ],
)
def test_a_mixture_env_refuses_bad_settings_by_name(kwargs, named) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        _env("a", **{"weight": 1.0, **kwargs})


def test_a_mixture_refuses_twice_a_name_bad_names_and_no_tasks() -> None:
    with pytest.raises(InvalidArgumentError, match="distinct"):
        check_mixture([_env("a", 1), _env("a", 2)])
    with pytest.raises(InvalidArgumentError, match="letters, digits"):
        _env("a/b", 1)
    with pytest.raises(InvalidArgumentError, match="no training tasks"):
        MixtureEnv(name="a", env_factory="llm_gym.envs.guess_number:GuessNumberEnv", tasks=[])
    with pytest.raises(InvalidArgumentError, match="at least one"):
        check_mixture([])


def test_config_entries_refuse_unknown_keys_and_twice_an_id() -> None:
    from trainers.mixture.config import mixture_entries

    with pytest.raises(InvalidArgumentError, match="Unknown key"):
        mixture_entries([{"id": "GuessNumber-v0", "wieght": 2}])
    with pytest.raises(InvalidArgumentError, match="more than once"):
        mixture_entries([{"id": "GuessNumber-v0"}, "GuessNumber-v0"])
    with pytest.raises(InvalidArgumentError, match="non-empty list"):
        mixture_entries([])
    entries = mixture_entries(["GuessNumber-v0", {"id": "GuessNumber-v0", "name": "g2"}])
    assert [e.label for e in entries] == ["GuessNumber-v0", "g2"]


# --- metrics ------------------------------------------------------------------------------------


def _episode(env: str, reward: float, turns_tokens: int = 0) -> Episode:
    episode = Episode(Task(prompt="q"), 0, 0, [], [], reward, True, False, env_id=env)
    episode.completion_tokens = turns_tokens
    return episode


def test_env_metrics_by_hand() -> None:
    episodes = [_episode("a", 1.0, 10), _episode("a", 0.0, 30), _episode("b", 0.5, 5)]
    metrics = env_metrics(episodes)
    assert metrics["env/a/reward"] == 0.5
    assert metrics["env/a/success_rate"] == 0.5  # reward 1.0 succeeds, 0.0 does not
    assert metrics["env/a/completion_tokens_mean"] == 20.0
    assert metrics["env/a/share"] == pytest.approx(2 / 3) and metrics["env/b/episodes"] == 1.0
    assert metrics["env/b/truncated_ratio"] == 0.0
    assert env_metrics([Episode(Task(prompt="q"), 0, 0, [], [], 1.0, True, False)]) == {}


# --- a short run on five environments -----------------------------------------------------------

FIVE = [("ToolUseGame-v0", 2), ("GuessNumber-v0", 1), ("Wordle-v0", 1), ("Maze-v0", 1),
        ("Math-v0", 1)]  # fmt: skip


def _five_envs() -> list[MixtureEnv]:
    from llm_gym.core.registry import env_entry

    envs = []
    for name, weight in FIVE:
        entry = env_entry(name)
        envs.append(
            MixtureEnv(
                name=name,
                env_factory=entry.env_factory(),
                tasks=entry.tasks("train")[:6],
                weight=weight,
                max_turns=2,
                val_tasks=entry.tasks("val")[:1],
                validation_interval=1 if name == "GuessNumber-v0" else None,
                val_max_turns=3 if name == "GuessNumber-v0" else None,
            )
        )
    return envs


def _mixture_trainer(model_dir, output_dir, **config):
    pytest.importorskip("trl")
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    settings = dict(
        output_dir=str(output_dir), model=str(model_dir), batch_size=6, episodes_per_task=2,
        num_steps=2, max_turns=2, max_model_length=512, max_tokens_per_turn=8, use_cpu=True,
        report_to="none", disable_tqdm=True, learning_rate=1e-3, logging_steps=1,
        validation_interval=2, save_strategy="steps", save_steps=1,
        save_episodes=str(output_dir / "episodes"),
    )  # fmt: skip
    settings.update(config)
    return MultiTurnGRPOTrainer(args=GRPOConfig(**settings), envs=_five_envs())


def _played(path) -> list[tuple[str, str]]:
    """The (env, task id) pairs of a step's saved episodes."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted({(r["env_id"], r["task_id"]) for r in rows})


def test_a_mixture_of_five_envs_trains_logs_per_env_and_resumes_the_same_draw(
    small_model_dir, tmp_path
) -> None:
    trainer = _mixture_trainer(small_model_dir, tmp_path / "run")
    trainer.train()
    assert trainer.state.global_step == 2
    # shares 1/3 and 1/6 x 4, 6 groups a step. Slot 0: deadlines 3 vs 6 -> env 0; slot 1: env 0
    # has 1 of 2/3 -> env 1; slot 2: env 0 has 1 of 1, env 1 1 of 1/2 -> env 2; slot 3: env 0
    # (1 of 4/3) and env 3 tie at deadline 6 -> env 0; then env 3, env 4
    slots = stratified_slots([w for _, w in FIVE], [0] * 5, 12)
    assert slots == [0, 1, 2, 0, 3, 4, 0, 1, 2, 0, 3, 4]
    logged = [r for r in trainer.state.log_history if "env/Math-v0/episodes" in r]
    assert len(logged) == 2
    for record in logged:  # 2 episodes per group: 4 of ToolUseGame, 2 of each other env
        assert record["env/ToolUseGame-v0/episodes"] == 4.0
        assert record["env/Maze-v0/episodes"] == 2.0
        assert record["env/ToolUseGame-v0/share"] == pytest.approx(1 / 3)
        for key in ("reward", "success_rate", "truncated_ratio", "completion_tokens_mean"):
            assert f"env/Wordle-v0/{key}" in record
    # validation: GuessNumber every step (its own interval), the others every 2 (the run's)
    seen = [(r["step"], r["env"]) for r in trainer.validation_history]
    assert [s for s, env in seen if env == "GuessNumber-v0"] == [0, 1, 2]
    assert [s for s, env in seen if env == "Maze-v0"] == [0, 2]
    assert any("val/GuessNumber-v0/success_rate" in r for r in trainer.state.log_history)
    # the saved episodes name each env; step 2 played the draw's slots 6..11
    draw = MixtureDraw([w for _, w in FIVE], [6] * 5, seed=trainer.args.task_seed).take(12)
    envs = trainer.mixture.envs
    expected = sorted({(FIVE[e][0], envs[e].tasks[t].id) for e, t in draw[6:]})
    step2 = tmp_path / "run" / "episodes" / "step-000002.jsonl"
    assert _played(step2) == expected
    state = json.loads((tmp_path / "run" / "checkpoint-1" / "mixture_state-0.json").read_text())
    assert state["position"] == 6 and state["names"] == [name for name, _ in FIVE]

    # resume from checkpoint 1: step 2 plays the same slots as the run that went on
    resumed = _mixture_trainer(small_model_dir, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed.mixture.resume_position == 6
    again = tmp_path / "resumed" / "episodes" / "step-000002.jsonl"
    assert _played(again) == expected
