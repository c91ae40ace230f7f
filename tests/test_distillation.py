"""On-policy distillation: the teacher scores the student's own multi-turn samples, the per-token
reverse KL on policy tokens is the learning signal, env and tool tokens never train."""

from __future__ import annotations

import math

import pytest

from llm_gym.errors import InvalidArgumentError

pytest.importorskip("trl")
torch = pytest.importorskip("torch")


class ConstantTeacher:
    """log p = -1 for every token; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[int], int]] = []

    def logprobs(self, sequences):
        self.asked.extend(sequences)
        return [[-1.0] * (len(ids) - start) for ids, start in sequences]


def _batch():
    # two rows: row 0 = prompt [5, 6] + completion [7, 8, 9] where 8 is an env token;
    # row 1 = a padding row (nothing trains)
    return {
        "prompt_ids": torch.tensor([[5, 6], [0, 0]]),
        "prompt_mask": torch.tensor([[1, 1], [0, 1]]),
        "completion_ids": torch.tensor([[7, 8, 9], [0, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1], [0, 0, 0]]),
        "advantages": torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]),
        "sampling_per_token_logps": torch.tensor([[-0.25, -3.0, -2.0], [0.0, 0.0, 0.0]]),
    }


def test_distill_batch_on_hand_computed_values() -> None:
    from trainers.distillation.config import DistillationConfig, distill_batch

    batch, teacher = _batch(), ConstantTeacher()
    settings = DistillationConfig(teacher="t", kl_coef=2.0, reward_weight=0.5)
    kl_sum, tokens = distill_batch(batch, teacher, settings)
    # the teacher reads row 0 whole, unpadded, from the first completion token; row 1 not at all
    assert teacher.asked == [([5, 6, 7, 8, 9], 2)]
    # advantages: 0.5 * GRPO's + 2 * (teacher - student) on policy tokens, 0 on the env token
    expected = torch.tensor(
        [[0.5 * 0.5 + 2 * (-1.0 + 0.25), 0.0, 0.5 * 0.5 + 2 * (-1.0 + 2.0)], [0.0, 0.0, 0.0]]
    )
    assert torch.allclose(batch["advantages"], expected)
    # reverse KL estimate, student - teacher on the 2 policy tokens: (0.75) + (-1.0)
    assert tokens == 2 and math.isclose(kl_sum, -0.25)


def test_the_settings_are_checked_before_any_model_loads(tmp_path) -> None:
    from trainers import DistillationConfig, GRPOConfig

    def config(**distillation):
        return GRPOConfig(
            output_dir=str(tmp_path), max_turns=2, batch_size=2, distillation=distillation
        )

    for bad, field in [
        ({"teacher": ""}, "distillation.teacher"),
        ({"teacher": "t", "kl": 1}, "unknown: \\['kl'\\]"),
        ({"teacher": "t", "kl_coef": -1}, "distillation.kl_coef"),
        ({"teacher": "t", "kl_coef": 0.0}, "distillation.kl_coef"),
        ({"teacher": "t", "teacher_batch_size": 0}, "distillation.teacher_batch_size"),
        ({"teacher": {"base_url": "http://x/v1"}}, "distillation.teacher"),
        ({"teacher": {"model": "m", "base_url": "http://x", "device": "cpu"}}, "teacher"),
    ]:
        with pytest.raises(InvalidArgumentError, match=field):
            config(**bad)
    with pytest.warns(UserWarning, match="group of one"):
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, batch_size=2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no group-of-one warning when distilling
        args = config(teacher="models/sft")
    assert args.episodes_per_task == 1 and args.num_generations == 1
    assert args.distillation_settings == DistillationConfig(teacher="models/sft")
    as_object = GRPOConfig(
        output_dir=str(tmp_path), max_turns=2, batch_size=2,
        distillation=DistillationConfig(teacher={"model": "m", "base_url": "http://x/v1"}),
    )  # fmt: skip
    assert as_object.distillation["teacher"] == {"model": "m", "base_url": "http://x/v1"}


def _trainer(model_dir, tmp_path, teacher, **config):
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), model=str(model_dir), batch_size=2,
        max_turns=3, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", distillation={"teacher": teacher}, **config,
    )  # fmt: skip
    trainer = MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:4])
    )
    trainer.model.train()  # as in a training step (the metrics go to "train")
    return trainer


def test_a_teacher_equal_to_the_student_gives_zero_advantages(small_model_dir, tmp_path):
    # The teacher's logprobs line up with the sampler's token for token: the same weights as
    # teacher give advantages of 0 on every policy token (a shift by one would not).
    trainer = _trainer(small_model_dir, tmp_path, str(small_model_dir), temperature=1.0)
    batch = trainer._generate_and_score_completions([{"task_index": 0}, {"task_index": 1}])
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert mask.sum() > 0
    assert batch["advantages"][mask].abs().max() < 1e-4
    assert abs(trainer._metrics["train"]["distill/reverse_kl"][-1]) < 1e-4


def test_env_tokens_never_train_and_the_kl_is_logged(small_model_dir, tmp_path):
    trainer = _trainer(small_model_dir, tmp_path, "unused")
    trainer.teacher = teacher = ConstantTeacher()
    batch = trainer._generate_and_score_completions([{"task_index": 0}, {"task_index": 1}])
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    expected = -1.0 - batch_sampling_logps(trainer, batch)
    assert torch.allclose(batch["advantages"][mask], expected[mask], atol=1e-6)
    assert (batch["advantages"][~mask] == 0).all()  # env/tool tokens and padding
    assert len(teacher.asked) == int(mask.any(1).sum())
    kl = trainer._metrics["train"]["distill/reverse_kl"][-1]
    assert math.isclose(kl, float((-expected)[mask].mean()), rel_tol=1e-5)


def batch_sampling_logps(trainer, batch):
    """The sampler's logprobs of the batch's tokens, recomputed by the trainer's model at
    temperature 1 (the run samples at 1.0): equal to what ``distill_batch`` read."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention, batch["completion_ids"].size(1)
        )
    return logps


def test_a_distillation_run_from_a_served_teacher_and_from_train_py(small_model_dir, tmp_path):
    """Two optimizer steps with the teacher behind our OpenAI-compatible server (prompt
    logprobs over /v1/completions), groups of one; then the same settings read from a train.py
    config's ``distillation:`` section."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.serving.openai_server import serve
    from trainers import GRPOConfig, train_multi_turn
    from trainers.pipeline.config import load_config
    from trainers.pipeline.run import build_grpo_config

    with serve(small_model_dir, model_name="teacher", device="cpu") as server:
        teacher = {"model": "teacher", "base_url": server.url}
        config = GRPOConfig(
            output_dir=str(tmp_path / "run"), model=str(small_model_dir), batch_size=2,
            num_steps=2, max_turns=2, max_model_length=1024, max_tokens_per_turn=8,
            use_cpu=True, save_strategy="no", report_to="none", logging_steps=1,
            distillation={"teacher": teacher, "kl_coef": 1.0},
        )  # fmt: skip
        trainer = train_multi_turn(
            config, tasks=list(get_tasks("train")[:4]), env_factory=ToolUseGameEnv
        )
    assert trainer.state.global_step == 2
    logged = [r for r in trainer.state.log_history if "distill/reverse_kl" in r]
    assert len(logged) == 2 and all(math.isfinite(r["distill/reverse_kl"]) for r in logged)
    path = tmp_path / "run.yaml"
    path.write_text(
        "env: ToolUseGame-v0\ngrpo:\n  batch_size: 2\n  num_steps: 2\n"
        "distillation:\n  teacher: models/sft\n  kl_coef: 0.5\n"
    )
    pipeline = load_config(path)
    args = build_grpo_config(pipeline, str(small_model_dir), max_turns=2, use_cpu=True)
    assert args.distillation_settings.kl_coef == 0.5
    assert args.distillation_settings.teacher == "models/sft"
