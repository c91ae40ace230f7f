"""The skill the main job rests on: at the default SFT learning rate, the embedded tiny model learns
to copy a looked-up number into its answer. Measured with this test's setup: at 5e-4 the last
loss is 0.001 and it passes; at the old default, 2e-3, the loss stays at 0.07 and only 21 of the
40 answers are copied exactly. Slow: 1,000 short SFT steps (about 2 minutes on 2 cores)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.envs.tool_use_game import ToolUseGameEnv, generate_tasks, oracle_action  # noqa: E402
from llm_gym.policies import OraclePolicy  # noqa: E402
from llm_gym.rollout import collect_groups  # noqa: E402
from trainers.sft.data import (  # noqa: E402
    episode_to_messages,
    oracle_sft_dataset,
    short_context_dataset,
)
from trainers.sft.settings import SFTSettings  # noqa: E402
from trainers.sft.train import sft_warm_start  # noqa: E402


def _lookups(seed: int, n: int) -> list:
    """``n`` lookup questions, each in a world of its own (the same question in many worlds)."""
    tasks = generate_tasks(seed, 20 * n, world_seed="varied", worlds_per_question=20)
    return [t for t in tasks if t.metadata["type"] == "lookup"][:n]


@pytest.mark.slow
def test_the_default_sft_learning_rate_teaches_the_tiny_model_to_copy_numbers(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.models import build_tiny_model

    base = build_tiny_model(tmp_path / "base", envs=["ToolUseGame-v0"])
    train = _lookups(1, 2000)
    out = sft_warm_start(
        base,
        tmp_path / "sft",
        short_context_dataset(oracle_sft_dataset("ToolUseGame-v0", tasks=train)),
        SFTSettings(max_steps=1000, batch_size=16, lr_scheduler_type="constant", progress=False),
    )
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    held_out = _lookups(2, 40)  # other worlds: the numbers can only be copied
    episodes = [
        g[0]
        for g in collect_groups(ToolUseGameEnv, held_out, OraclePolicy(oracle_action), max_turns=6)
    ]
    exact = 0
    for episode in episodes:
        messages = [m for m in episode_to_messages(episode) if m["role"] != "system"]
        ids = tokenizer.apply_chat_template(messages, return_dict=True)["input_ids"]
        prefix = tokenizer.apply_chat_template(
            messages[:-1], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        with torch.no_grad():
            predicted = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)
        answer = range(len(prefix), len(ids) - 1)  # the answer's tokens and its end marker
        exact += all(predicted[p - 1].item() == ids[p] for p in answer)
    assert episodes[0].turns[-1].text.isdigit()  # the answer is the looked-up number
    assert exact >= 36, f"{exact} of {len(episodes)} answers copied exactly"
