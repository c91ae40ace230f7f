"""Thinking models: the config's ``chat_template_kwargs`` reaches the rollout and the samples."""

from __future__ import annotations

import shutil

import pytest

from llm_gym.core.env import Env, StepResult

pytest.importorskip("trl")

GENERATION_PROMPT = (
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}"
)
QWEN3_STYLE = (
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}"
)


@pytest.fixture
def thinking_model_dir(small_model_dir, tmp_path):
    """The small test model with a Qwen3-style template: ``enable_thinking=False`` opens the
    assistant's turn with an empty think block."""
    target = tmp_path / "thinking"
    shutil.copytree(small_model_dir, target)
    template = target / "chat_template.jinja"
    text = template.read_text()
    assert GENERATION_PROMPT in text
    template.write_text(text.replace(GENERATION_PROMPT, QWEN3_STYLE))
    return target


def _prompts(model_dir, tmp_path, **config) -> list[str]:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        model=str(model_dir),
        batch_size=1,
        episodes_per_task=2,
        max_turns=2,
        max_model_length=1024,
        max_tokens_per_turn=8,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        **config,
    )
    trainer = MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:2])
    )
    groups = trainer.collect(trainer.tasks[:1], episodes_per_task=2, temperature=1.0, max_turns=2)
    tokenizer = trainer.episode_tokenizer
    return [tokenizer.decode(s.prompt_ids) for e in groups[0] for s in e.samples]


def test_enable_thinking_reaches_the_samples_the_trainer_trains_on(thinking_model_dir, tmp_path):
    off = _prompts(thinking_model_dir, tmp_path, chat_template_kwargs={"enable_thinking": False})
    assert off and all(p.endswith("<think>\n\n</think>\n\n") for p in off)
    default = _prompts(thinking_model_dir, tmp_path)
    assert default and not any("<think>" in p for p in default)
    as_json = _prompts(
        thinking_model_dir, tmp_path, chat_template_kwargs='{"enable_thinking": false}'
    )
    assert as_json == off


def test_chat_template_kwargs_must_be_a_mapping(tmp_path) -> None:
    from llm_gym.errors import InvalidArgumentError
    from trainers import GRPOConfig

    with pytest.raises(InvalidArgumentError, match="chat_template_kwargs"):
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, chat_template_kwargs="[1, 2]")


class KeepTalking(Env):
    """Two turns whatever the model says (raw text), rewarded by the length of its replies, so
    the group's advantages differ from episode to episode."""

    raw_text_actions = True

    async def reset(self, task):
        self._messages = [{"role": "user", "content": "Say something."}]
        return list(self._messages)

    async def step(self, message):
        self._messages += [message, {"role": "user", "content": "And more?"}]
        turns = sum(m["role"] == "assistant" for m in self._messages)
        reward = float(sum(len(m["content"]) for m in self._messages) % 7)
        return StepResult(
            terminated=turns >= 2, truncated=False, messages=list(self._messages), reward=reward
        )

    @property
    def messages(self):
        return list(self._messages)

    @property
    def tool_specs(self):
        return []


def _batch(model_dir, tmp_path, **config):
    from llm_gym import Task
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), model=str(model_dir), batch_size=2,
        episodes_per_task=2, max_turns=2, max_model_length=1024, max_tokens_per_turn=6,
        use_cpu=True, save_strategy="no", report_to="none", seed=3, scale_rewards="none",
        chat_template_kwargs={"enable_thinking": False}, **config,
    )  # fmt: skip
    trainer = MultiTurnGRPOTrainer(args=args, env_factory=KeepTalking, tasks=[Task("a"), Task("b")])
    captured = {}
    collect = trainer.collect

    def spy(*a, **k):
        captured["groups"] = collect(*a, **k)
        return captured["groups"]

    trainer.collect = spy
    inputs = [{"task_index": i} for i in (0, 0, 1, 1)]
    batch = trainer._generate_and_score_completions(inputs)
    return batch, captured["groups"]


def test_an_episode_the_template_splits_trains_on_every_sample(thinking_model_dir, tmp_path):
    # enable_thinking=False: each turn's context ends with an empty think block that the
    # template drops from earlier assistant turns, so a two-turn episode is two samples.
    batch, groups = _batch(thinking_model_dir, tmp_path)
    episodes = [e for g in groups for e in g]
    assert all(len(e.samples) == 2 for e in episodes)
    rewards = [[e.reward for e in g] for g in groups]
    assert len({r for g in rewards for r in g}) > 1  # some advantage is not zero
    mask = batch["completion_mask"] * batch["tool_mask"]
    assert batch["advantages"].size(0) == 8  # every sample is a row (was: one per episode)
    row = 0
    for g, group in enumerate(groups):
        mean = sum(rewards[g]) / len(rewards[g])
        for episode in group:
            for sample in episode.samples:  # each carries the episode's advantage
                trained = mask[row].bool()
                assert int(trained.sum()) == sum(sample.env_mask) > 0
                expected = episode.reward - mean
                assert torch_allclose(batch["advantages"][row][trained], expected)
                row += 1
    capped, _ = _batch(thinking_model_dir, tmp_path, max_samples_per_episode=1)
    assert capped["advantages"].size(0) == 4  # the cap keeps the first sample of each


def torch_allclose(values, expected: float) -> bool:
    import torch

    return bool(torch.allclose(values, torch.full_like(values, expected), atol=1e-5))
