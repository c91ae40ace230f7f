"""trainers.grpo.best_point: the rule on hand-computed validation histories, the config's and the
trainer's refusals, and a short run whose model ends bitwise at its best validation point."""

from __future__ import annotations

import pytest

from llm_gym.errors import InvalidArgumentError
from trainers.grpo.best_point import best_point, improves, mixture_point, point_value

NAN = float("nan")


@pytest.mark.parametrize(
    ("values", "point"),
    [
        ({"a": 0.5, "b": 0.25}, 0.375),  # the unweighted mean
        ({"a": 0.5}, None),  # b has not validated at this step: not a point
        ({"a": 0.5, "b": 0.25, "c": 1.0}, 0.375),  # c is not validated: not counted
        ({"a": 0.0, "b": 0.0}, 0.0),
    ],
)
def test_a_mixtures_point_is_the_mean_over_its_validated_envs(values, point) -> None:
    assert mixture_point(values, ["a", "b"]) == point
    assert mixture_point(values, []) is None


@pytest.mark.parametrize(
    ("history", "kept"),
    [
        ([(0, 0.25), (10, 0.75), (20, 0.5)], (10, 0.75)),  # the middle point
        ([(0, 0.40), (10, 0.78), (20, 0.50)], (10, 0.78)),  # rose, then fell past its best
        ([(0, 0.25), (10, 0.5), (20, 0.75)], (20, 0.75)),  # still rising: the last step
        ([(0, 0.25), (10, 0.75), (20, 0.75)], (10, 0.75)),  # a tie: the earlier point
        ([(0, 0.5), (10, 0.5), (20, 0.25)], (0, 0.5)),  # never above the start: the start
        ([(0, NAN), (10, 0.25), (20, NAN)], (10, 0.25)),  # NaN is never a best
        ([(0, 0.0)], (0, 0.0)),
        ([], None),
    ],
)
def test_the_kept_point_is_the_earliest_of_the_highest_value(history, kept) -> None:
    assert best_point(history) == kept


@pytest.mark.parametrize(
    ("value", "best", "replaces"),
    [(0.5, None, True), (0.5, 0.5, False), (0.51, 0.5, True), (0.49, 0.5, False),
     (NAN, None, False), (NAN, 0.5, False), (0.0, None, True), (-1.0, None, True)],
)  # fmt: skip
def test_a_point_replaces_the_best_only_when_strictly_higher(value, best, replaces) -> None:
    assert improves(value, best) is replaces


def test_a_validation_without_the_metric_is_not_a_point() -> None:
    assert point_value({"step": 3, "episodes": 0.0}, "val/success_rate") is None
    assert point_value({"step": 3, "reward_mean": -0.1}, "val/reward_mean") == -0.1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keep_best": "val/sucess_rate"}, "keep_best must be None or one of.*'val/success_rate'"),
        ({"keep_best": "success_rate"}, "keep_best must be None or one of"),
        ({"keep_best": 1}, "keep_best must be None or one of"),
        ({"keep_best": "val/success_rate", "validation_interval": None}, "validation_interval"),
        (
            {"keep_best": "val/success_rate", "load_best_model_at_end": True},
            "load_best_model_at_end must be False with keep_best",
        ),
    ],
)
def test_the_config_refuses_what_keep_best_cannot_serve(fields, message, tmp_path) -> None:
    from trainers import GRPOConfig

    settings = {"validation_interval": 1, "episodes_per_task": 2, **fields}
    with pytest.raises(InvalidArgumentError, match=message):
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, use_cpu=True, **settings)


def _trainer(model_dir, output_dir, cls=None, val_tasks=True, **config):
    """A trainer on the small test model, two tasks a step in groups of four, whose episodes'
    rewards differ by a reward function (so every step moves the weights)."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    def length_parity(prompts, completions, **kwargs):
        return [float(len(str(c)) % 2) for c in completions]

    args = GRPOConfig(
        output_dir=output_dir, model=str(model_dir), batch_size=2, episodes_per_task=4,
        max_turns=1, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", learning_rate=1e-2, logging_steps=1,
        **{"num_steps": 2, "validation_interval": 1, "keep_best": "val/success_rate", **config},
    )  # fmt: skip
    return (cls or MultiTurnGRPOTrainer)(
        args=args,
        env_factory=ToolUseGameEnv,
        tasks=list(get_tasks("train")[:2]),
        val_tasks=list(get_tasks("val")[:1]) if val_tasks else None,
        reward_funcs=[length_parity],
    )


def test_a_trainer_without_validation_tasks_is_refused(small_model_dir, tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="no validation tasks; pass val_tasks"):
        _trainer(small_model_dir, str(tmp_path), val_tasks=False)


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        ((0.25, 0.75, 0.75), 1),  # the earlier of a tie, not the last step
        ((0.5, 0.25, 0.5), 0),  # never above the start: the weights it started from
    ],
)
def test_the_run_ends_bitwise_at_its_best_validation_point(
    small_model_dir, tmp_path, values, kept
) -> None:
    """Validation values scripted per step (steps 0 to 2): the model ends with bitwise the
    weights validated at the kept step, and those differ from every other step's."""
    import torch

    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    class Scripted(MultiTurnGRPOTrainer):
        validated: dict[int, dict[str, torch.Tensor]] = {}

        def validate(self, tasks=None, *, env=None):
            step = self.state.global_step
            self.validated[step] = {
                name: p.detach().clone() for name, p in self.model.named_parameters()
            }
            summary = {"success_rate": values[step]}
            self.validation_history.append({"step": step, **summary})
            return summary

    trainer = _trainer(small_model_dir, str(tmp_path), cls=Scripted)
    trainer.train()
    assert sorted(Scripted.validated) == [0, 1, 2]
    final = {name: p.detach() for name, p in trainer.model.named_parameters()}

    def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[name], weight) for name, weight in b.items())

    points = Scripted.validated
    others = [step for step in points if step != kept]
    # each step moved the weights, so the points can be told apart
    assert not any(equal(points[kept], points[step]) for step in others)
    assert equal(final, points[kept]) and not any(equal(final, points[s]) for s in others)
    assert trainer.best_point is not None and trainer.best_point.as_json() == {
        "metric": "val/success_rate", "step": kept, "value": values[kept], "final_step": 2,
        "final_value": values[2],
    }  # fmt: skip
    [record] = [r for r in trainer.state.log_history if "best/step" in r]
    assert record["best/step"] == kept and record["best/val/success_rate"] == values[kept]


def test_a_mixture_keeps_the_best_step_at_which_every_env_validated(small_model_dir, tmp_path):
    """Two environments validated every step (a) and every second step (b), three steps: the
    points are steps 0, 2 and 3 (the last step validates both), valued at the mean of a and b;
    a's high value at step 1 is no point. The model ends bitwise at step 2's weights."""
    import torch

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer
    from trainers.mixture.env import MixtureEnv

    values = {"a": [0.0, 1.0, 0.5, 0.25], "b": [0.0, None, 0.5, 0.25]}  # means 0, -, 0.5, 0.25
    validated: dict[tuple[int, str], dict[str, torch.Tensor]] = {}

    class Scripted(MultiTurnGRPOTrainer):
        def validate(self, tasks=None, *, env=None):
            step = self.state.global_step
            validated[step, env] = {
                name: p.detach().clone() for name, p in self.model.named_parameters()
            }
            summary = {"success_rate": values[env][step]}
            self.validation_history.append({"step": step, "env": env, **summary})
            return summary

    def length_parity(prompts, completions, **kwargs):
        return [float(len(str(c)) % 2) for c in completions]

    envs = [
        MixtureEnv(
            name=name,
            env_factory=ToolUseGameEnv,
            tasks=list(get_tasks("train")[:2]),
            val_tasks=list(get_tasks("val")[:1]),
            validation_interval=every,
        )
        for name, every in (("a", 1), ("b", 2))
    ]
    args = GRPOConfig(
        output_dir=str(tmp_path), model=str(small_model_dir), batch_size=2, episodes_per_task=4,
        max_turns=1, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", learning_rate=1e-2, logging_steps=1, num_steps=3,
        validation_interval=1, keep_best="val/success_rate",
    )  # fmt: skip
    trainer = Scripted(args=args, envs=envs, reward_funcs=[length_parity])
    trainer.train()
    assert sorted(validated) == [
        (0, "a"), (0, "b"), (1, "a"), (2, "a"), (2, "b"), (3, "a"), (3, "b")
    ]  # fmt: skip
    assert trainer.best_point is not None and trainer.best_point.as_json() == {
        "metric": "val/success_rate", "step": 2, "value": 0.5, "final_step": 3,
        "final_value": 0.25,
    }  # fmt: skip
    final = {name: p.detach() for name, p in trainer.model.named_parameters()}
    for (step, _), weights in validated.items():
        same = all(torch.equal(weights[name], w) for name, w in final.items())
        assert same is (step == 2), step


def test_a_mixture_without_validation_tasks_is_refused(small_model_dir, tmp_path) -> None:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer
    from trainers.mixture.env import MixtureEnv

    envs = [
        MixtureEnv(name=name, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:2]))
        for name in ("a", "b")
    ]
    args = GRPOConfig(
        output_dir=str(tmp_path), model=str(small_model_dir), batch_size=2, episodes_per_task=2,
        max_turns=1, use_cpu=True, report_to="none", num_steps=1, validation_interval=1,
        keep_best="val/success_rate",
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="no validation tasks.*an entry's val_tasks"):
        MultiTurnGRPOTrainer(args=args, envs=envs)
