"""Thinking models: the config's ``chat_template_kwargs`` reaches the rollout and the samples."""

from __future__ import annotations

import shutil

import pytest

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
    from trainers.trainer import MultiTurnGRPOTrainer

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
    groups = trainer._collect(trainer.tasks[:1], episodes_per_task=2, temperature=1.0, max_turns=2)
    tokenizer = trainer._episode_tokenizer
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
