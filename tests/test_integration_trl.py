"""TRL's own GRPOTrainer on our environments (llm_gym.integrations.trl)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from llm_gym import InvalidArgumentError
from llm_gym.core.registry import env_entry
from llm_gym.envs.tool_use_game import FACTS, ToolUseGameEnv, get_tasks
from llm_gym.integrations.trl import env_reward, environment_factory, our_rendering, trl_dataset
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD


def _episode(split: str = "val", index: int = 0):
    cls = environment_factory("ToolUseGame-v0", split=split)
    episode = cls()
    row = trl_dataset("ToolUseGame-v0", split, limit=index + 1)[index]
    episode.reset(**row)
    return cls, episode, get_tasks(split)[index]


def test_the_class_has_one_method_per_tool_with_our_spec() -> None:
    cls, _, _ = _episode()
    tools = [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]
    assert sorted(tools) == ["calculator", "list_fact_keys", "lookup"]
    transformers = pytest.importorskip("transformers")
    from transformers.utils import get_json_schema

    ours = {s["function"]["name"]: s["function"] for s in ToolUseGameEnv().tool_specs}
    for name in tools:
        theirs = get_json_schema(getattr(cls(), name))["function"]
        assert theirs["description"] == ours[name]["description"]
        assert theirs["parameters"]["properties"] == ours[name]["parameters"]["properties"]
        assert theirs["parameters"].get("required", []) == ours[name]["parameters"]["required"]
    assert transformers


def test_tools_run_in_the_episode_and_the_reward_comes_from_the_env() -> None:
    _, episode, task = _episode()
    keys = task.metadata["keys"]
    values = [episode.lookup(key=key) for key in keys]
    assert values == [str(FACTS[k]) for k in keys]
    assert episode.lookup(key="Nowhere.population").startswith("tool_error: unknown key")
    if task.metadata["expression"]:
        answer = episode.calculator(task.metadata["expression"].format(*values))
    elif task.metadata["type"] == "compare":
        answer = keys[0].split(".")[0] if int(values[0]) > int(values[1]) else keys[1].split(".")[0]
    else:
        answer = values[0]
    completion = [{"role": "assistant", "content": answer}]
    assert env_reward([completion], [episode]) == [1.0]
    assert episode.done and episode.reward == 1.0
    _, wrong, _ = _episode()
    assert env_reward([[{"role": "assistant", "content": "-1"}]], [wrong]) == [0.0]


def test_a_row_without_a_known_task_is_a_clear_error() -> None:
    cls = environment_factory("ToolUseGame-v0", split="val")
    with pytest.raises(InvalidArgumentError, match="names no task"):
        cls().reset(prompt=[], task_id="nope")


def test_trl_s_tool_loop_gets_the_drivers_turn_limit() -> None:
    cls = environment_factory("ToolUseGame-v0", split="val", max_turns=2)
    episode = cls()
    episode.reset(**trl_dataset("ToolUseGame-v0", "val", limit=1)[0])
    assert episode.list_fact_keys() != "" and not episode.done
    assert episode.list_fact_keys() != ""  # the second turn is the last
    assert episode.done and episode.ending_cause == "max_turns" and episode.reward == 0.0
    assert episode.lookup(key="Velmora.population") == "tool_error: no episode is running."
    assert env_reward([[{"role": "assistant", "content": "1"}]], [episode]) == [0.0]
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        environment_factory("ToolUseGame-v0", max_turns=0)


def test_a_garbled_final_reply_is_a_parse_failure_as_in_our_loop() -> None:
    _, episode, _ = _episode()
    reply = "<tool_call>{not json</tool_call>"
    assert env_reward([[{"role": "assistant", "content": reply}]], [episode]) == [
        DEFAULT_FAILED_PARSE_REWARD
    ]
    assert episode.ending_cause == "parse_failure"


class Broken(ToolUseGameEnv):
    async def step(self, message):
        raise RuntimeError("the env broke")


def test_a_step_that_raises_ends_the_episode_instead_of_raising_into_trl() -> None:
    broken = dataclasses.replace(env_entry("ToolUseGame-v0"), env_spec=Broken)
    cls = environment_factory(broken, split="val")
    episode = cls()
    episode.reset(**trl_dataset("ToolUseGame-v0", "val", limit=1)[0])
    assert episode.list_fact_keys() == "tool_error: the episode ended (env)."
    assert episode.done and episode.ending.error and "the env broke" in episode.ending.error


def test_our_rendering_gives_trl_our_prompt_ids(small_model_dir) -> None:
    from transformers import AutoTokenizer

    from llm_gym.policies.chat import render_chat

    cls, episode, task = _episode()
    tokenizer = our_rendering(AutoTokenizer.from_pretrained(small_model_dir), cls._specs)
    tools = [getattr(episode, n) for n in ("calculator", "list_fact_keys", "lookup")]
    row = trl_dataset("ToolUseGame-v0", "val", limit=1)[0]
    theirs = tokenizer.apply_chat_template(
        row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False
    )
    env = ToolUseGameEnv()
    import asyncio

    ours = render_chat(
        tokenizer, asyncio.run(env.reset(task)), env.tool_specs, add_generation_prompt=True
    )
    assert theirs == ours


def test_trl_trains_two_steps_on_tool_use_game(small_model_dir, tmp_path) -> None:
    """TRL's GRPOTrainer, its own tool loop, our environment and reward: two optimizer steps."""
    pytest.importorskip("trl")
    import os
    import warnings

    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore")
    factory = environment_factory("ToolUseGame-v0")
    tokenizer = our_rendering(AutoTokenizer.from_pretrained(small_model_dir), factory._specs)
    trainer = GRPOTrainer(
        model=str(small_model_dir),
        processing_class=tokenizer,
        args=GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            num_generations=2,
            per_device_train_batch_size=4,
            max_completion_length=96,
            generation_kwargs={"max_new_tokens": 16},
            max_tool_calling_iterations=2,
            max_steps=2,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            beta=0.0,
        ),
        train_dataset=trl_dataset("ToolUseGame-v0", "train", limit=8),
        environment_factory=factory,
        reward_funcs=[env_reward],
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    assert len(logged) == 2 and trainer.state.global_step == 2
    assert all(0.0 <= h["rewards/env_reward/mean"] <= 1.0 for h in logged)
