"""Our rollout engine inside TRL's own GRPOTrainer (llm_gym.integrations.trl.rollout)."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace as NS

import pytest

from llm_gym import InvalidArgumentError
from llm_gym.core.env import TruncationCause
from llm_gym.core.task import Task
from llm_gym.envs.tool_use_game import ToolUseGameEnv
from llm_gym.integrations.trl import (
    EXTRA_FIELDS,
    RolloutRow,
    rollout_func,
    rollout_reward,
    trl_dataset,
    trl_rollout_output,
)
from llm_gym.policies import Generation, OraclePolicy, Policy
from llm_gym.policies.chat import render_chat
from llm_gym.rollout import Episode

pytest.importorskip("datasets")

LOGPROB = -0.25
"""The logprob the scripted token policy reports for every token it samples."""


class TokenScript(Policy):
    """Token-in/token-out stand-in for a model: the oracle's text (or a fixed ``answer``),
    tokenized and ended with the end-of-turn token, every token with logprob :data:`LOGPROB`."""

    def __init__(self, tokenizer, answer: str | None = None) -> None:
        self.tokenizer, self.answer, self.sampled = tokenizer, answer, []

    async def act(self, requests):
        texts = [g.text for g in await OraclePolicy().act(requests)]
        out = []
        for text in texts if self.answer is None else [self.answer] * len(requests):
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            self.sampled.append(ids)
            out.append(Generation(text=text, token_ids=ids, logprobs=[LOGPROB] * len(ids)))
        return out


def _rows(split: str, count: int, repeat: int) -> list[dict]:
    rows = list(trl_dataset("ToolUseGame-v0", split, limit=count))
    return [row for row in rows for _ in range(repeat)]


def _trainer(tokenizer, rows, *, generations: int = 2, training: bool = True) -> NS:
    """The attributes of ``GRPOTrainer`` a rollout with its own policy reads."""
    environments = []
    for row in rows:
        environments.append(RolloutRow())
        environments[-1].reset(**row)
    return NS(
        environments=environments,
        model=NS(training=training),
        num_generations=generations,
        num_generations_eval=1,
        processing_class=tokenizer,
        max_completion_length=64,
    )


@pytest.fixture(scope="module")
def tokenizer(small_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(small_model_dir)


def test_the_oracle_episode_becomes_trls_dict(tokenizer) -> None:
    rows = _rows("val", 2, repeat=2)
    policy = TokenScript(tokenizer)
    rollout = rollout_func("ToolUseGame-v0", split="val", policy=policy)
    out = rollout([row["prompt"] for row in rows], _trainer(tokenizer, rows))

    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", *EXTRA_FIELDS}
    assert all(len(out[key]) == 4 for key in out)
    episodes = rollout.last_episodes
    assert [e.task.id for e in episodes] == [row["task_id"] for row in rows]
    assert [e.group for e in episodes] == [0, 0, 1, 1]  # each row's repeats are one group
    env = ToolUseGameEnv()
    sampled = iter(policy.sampled)  # the policy answers the episodes turn by turn, in order
    by_episode: list[list[list[int]]] = [[] for _ in episodes]
    for turn in range(max(e.num_turns for e in episodes)):
        for i, episode in enumerate(episodes):
            if turn < episode.num_turns:
                by_episode[i].append(next(sampled))
    for i, episode in enumerate(episodes):
        completion, mask = out["completion_ids"][i], out["env_mask"][i]
        logprobs = out["logprobs"][i]
        assert len(completion) == len(mask) == len(logprobs)
        # The tokens under mask 1 are exactly what the policy sampled, turn after turn ...
        assert [t for t, m in zip(completion, mask, strict=True) if m] == [
            token for ids in by_episode[i] for token in ids
        ]
        assert logprobs == [LOGPROB if m else 0.0 for m in mask]
        # ... the environment's replies fill the gaps (a lookup, a calculation: mask 0) ...
        assert 0 in mask and mask[-1] == 1
        # ... and prompt + completion decode to the episode's transcript.
        opening = asyncio.run(env.reset(episode.task))
        prompt = render_chat(tokenizer, opening, env.tool_specs, add_generation_prompt=True)
        assert tokenizer.decode(out["prompt_ids"][i]) == prompt
        transcript = list(opening)  # the assistant turns as the model wrote them
        for turn in episode.turns[:-1]:
            transcript += [{"role": "assistant", "content": turn.text}, *turn.env_messages]
        before_answer = render_chat(
            tokenizer, transcript, env.tool_specs, add_generation_prompt=True
        )
        text = tokenizer.decode(out["prompt_ids"][i] + completion)
        assert text == before_answer + episode.turns[-1].text + tokenizer.eos_token
        assert episode.messages[-1]["content"] == episode.turns[-1].text  # the answer
        # The oracle solves the task: the environment's reward, its turns, no truncation.
        assert out["episode_reward"][i] == episode.reward == 1.0
        assert out["truncation_cause"][i] is None
        assert out["episode_turns"][i] == episode.num_turns >= 2
    assert rollout_reward([None] * 4, **{k: out[k] for k in EXTRA_FIELDS}) == [1.0] * 4


def test_an_episode_the_env_ended_stops_at_the_models_last_token(tokenizer) -> None:
    """GuessNumber answers the winning guess ("Correct! ..."): that closing reply is not part
    of the completion, which ends with the model's end of turn (TRL would read the env's tail
    as a clipped completion and, with mask_truncated_completions, drop a solved episode)."""
    rows = [r for r in trl_dataset("GuessNumber-v0", "val", limit=2) for _ in range(2)]
    rollout = rollout_func("GuessNumber-v0", split="val", policy=TokenScript(tokenizer))
    out = rollout([row["prompt"] for row in rows], _trainer(tokenizer, rows))
    for i, episode in enumerate(rollout.last_episodes):
        assert episode.reward == 1.0 and episode.truncation_cause is None
        assert episode.turns[-1].env_messages  # the env did reply to the last guess ...
        assert out["env_mask"][i][-1] == 1  # ... but the completion ends with the model's
        assert out["completion_ids"][i][-1] == tokenizer.eos_token_id
        assert len(out["completion_ids"][i]) == len(out["env_mask"][i]) == len(out["logprobs"][i])
    cut = rollout_func("GuessNumber-v0", split="val", max_turns=1, policy=TokenScript(tokenizer))
    out = cut([row["prompt"] for row in rows], _trainer(tokenizer, rows))
    assert all(e.truncation_cause == "max_turns" for e in cut.last_episodes)
    assert all(mask[-1] == 0 for mask in out["env_mask"])  # cut short: the env's tail stays


def test_a_wrong_answer_gets_the_envs_zero(tokenizer) -> None:
    rows = _rows("val", 1, repeat=2)
    rollout = rollout_func("ToolUseGame-v0", split="val", policy=TokenScript(tokenizer, "-1"))
    out = rollout([row["prompt"] for row in rows], _trainer(tokenizer, rows))
    answer = [*tokenizer.encode("-1", add_special_tokens=False), tokenizer.eos_token_id]
    assert out["completion_ids"] == [answer, answer]
    assert out["env_mask"] == [[1] * len(answer)] * 2
    task = rollout.last_episodes[0].task
    env = ToolUseGameEnv()
    asyncio.run(env.reset(task))
    result = asyncio.run(env.step({"role": "assistant", "content": "-1"}))
    assert result.terminated and out["episode_reward"] == [result.reward] * 2 == [0.0, 0.0]


def test_a_text_only_policy_gives_no_logprobs(tokenizer) -> None:
    rows = _rows("val", 1, repeat=1)
    rollout = rollout_func("ToolUseGame-v0", split="val", policy=OraclePolicy())
    out = rollout([rows[0]["prompt"]], _trainer(tokenizer, rows, generations=1))
    assert out["logprobs"] is None  # TRL then has no sampler logprobs (allowed)
    assert out["episode_reward"] == [1.0] and sum(out["env_mask"][0]) > 0


def test_rows_out_of_trls_layout_run_as_groups_of_one(tokenizer) -> None:
    rows = _rows("val", 2, repeat=1) * 2  # r0 r1 r0 r1: not runs of num_generations
    rollout = rollout_func("ToolUseGame-v0", split="val", policy=TokenScript(tokenizer, "7"))
    rollout([row["prompt"] for row in rows], _trainer(tokenizer, rows))
    assert [e.group for e in rollout.last_episodes] == [0, 1, 2, 3]
    assert [e.task.id for e in rollout.last_episodes] == [row["task_id"] for row in rows]
    # In eval mode TRL repeats each row num_generations_eval times (1 here): still one each.
    rollout([row["prompt"] for row in rows], _trainer(tokenizer, rows, training=False))
    assert [e.group for e in rollout.last_episodes] == [0, 1, 2, 3]


def test_without_the_row_channel_or_a_known_task_is_a_clear_error(tokenizer) -> None:
    rows = _rows("val", 1, repeat=2)
    rollout = rollout_func("ToolUseGame-v0", split="val", policy=OraclePolicy())
    trainer = _trainer(tokenizer, rows)
    trainer.environments = None
    with pytest.raises(InvalidArgumentError, match="environment_factory=rollout.environment"):
        rollout([row["prompt"] for row in rows], trainer)
    train_rows = _rows("train", 1, repeat=2)  # a train row, but the rollout plays val
    with pytest.raises(InvalidArgumentError, match="names no task"):
        rollout([row["prompt"] for row in rows], _trainer(tokenizer, train_rows))
    with pytest.raises(InvalidArgumentError, match="max_turns must be an int >= 1"):
        rollout_func("ToolUseGame-v0", max_turns=0)


def test_an_episode_without_a_sampled_token_trains_nothing_and_is_void(tokenizer) -> None:
    opening = [{"role": "user", "content": "hi"}]
    episode = Episode(
        task=Task("hi"),
        group=0,
        index=0,
        messages=list(opening),
        turns=[],
        reward=0.0,
        terminated=False,
        truncated=True,
        truncation_cause=TruncationCause.POLICY_ERROR,
        num_opening_messages=1,
    )
    out = trl_rollout_output([episode], tokenizer)
    rendered = render_chat(tokenizer, opening, [], add_generation_prompt=True)
    assert tokenizer.decode(out["prompt_ids"][0]) == rendered
    assert out["completion_ids"] == [[tokenizer.eos_token_id]] and out["env_mask"] == [[0]]
    assert out["truncation_cause"] == ["policy_error"] and out["episode_turns"] == [0]
    assert rollout_reward(["x"], out["episode_reward"], out["truncation_cause"]) == [None]
    assert rollout_reward(["x", "y"], [-0.1, 0.5], ["parse_failure", "max_turns"]) == [-0.1, 0.5]


def test_under_vllm_the_trainers_engine_generates(tokenizer) -> None:
    pytest.importorskip("accelerate")
    answer = [*tokenizer.encode("-1", add_special_tokens=False), tokenizer.eos_token_id]

    class Engine:  # TRL's vLLM generation object, as VLLMPolicy drives it
        mode, tensor_parallel_size, temperature, max_completion_length = "colocate", 1, 1.0, 1
        calls: list = []

        def generate(self, prompts, images, num_generations):
            self.calls.append((prompts, self.temperature, self.max_completion_length))
            return prompts, [answer] * len(prompts), [[[-0.5]] * len(answer)] * len(prompts), None

    rows = _rows("val", 1, repeat=2)
    trainer = _trainer(tokenizer, rows)
    engine = Engine()
    trainer.__dict__.update(
        use_vllm=True,
        vllm_generation=engine,
        temperature=0.7,
        accelerator=NS(num_processes=1),
        eos_token_ids=[tokenizer.eos_token_id],
    )
    rollout = rollout_func("ToolUseGame-v0", split="val", max_new_tokens=12)
    out = rollout([row["prompt"] for row in rows], trainer)
    assert out["completion_ids"] == [answer, answer] and out["logprobs"] == [[-0.5] * 3] * 2
    prompts, temperature, budget = engine.calls[0]
    assert prompts == out["prompt_ids"] and (temperature, budget) == (0.7, 12)
    assert out["episode_reward"] == [0.0, 0.0]


def _replayed_reward(episode: Episode) -> float:
    """The reward a fresh environment gives the episode's assistant messages, step by step
    (a parse failure never reaches the environment: the driver's ``failed_parse_reward``)."""
    if episode.truncation_cause is TruncationCause.PARSE_FAILURE:
        return -0.1
    env = ToolUseGameEnv()
    asyncio.run(env.reset(episode.task))
    result = None
    for turn in episode.turns:
        result = asyncio.run(env.step(turn.message))
    assert result is not None
    return result.reward if result.terminated else 0.0


def _logprobs_under(model, out) -> list[list[float]]:
    """Each completion token's logprob under ``model`` (temperature 1), as a forward pass
    over the whole prompt + completion computes it."""
    import torch

    result = []
    with torch.no_grad():
        for prompt, completion in zip(out["prompt_ids"], out["completion_ids"], strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits[0, :-1].float()
            per_token = logits.log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
            result.append(per_token[-len(completion) :].tolist())
    return result


def test_trl_trains_two_steps_with_our_rollout(small_model_dir, tmp_path) -> None:
    """TRL's GRPOTrainer generating through our engine on its own model: two optimizer steps."""
    pytest.importorskip("trl")
    import os
    import warnings

    import torch
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore")
    # --- as in docs/guides/integrations.md -----------------------------------------------------
    rollout = rollout_func("ToolUseGame-v0", max_turns=3, max_new_tokens=16)
    calls = []  # what each step's rollout returned, and its episodes

    def recording(prompts, trainer):
        out = rollout(prompts, trainer)
        calls.append((out, rollout.last_episodes, _logprobs_under(trainer.model, out)))
        return out

    trainer = GRPOTrainer(
        model=str(small_model_dir),
        args=GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            num_generations=4,
            per_device_train_batch_size=8,
            max_completion_length=64,
            learning_rate=1e-2,
            max_steps=2,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            beta=0.0,
        ),
        train_dataset=trl_dataset("ToolUseGame-v0", "train", limit=16),
        rollout_func=recording,
        environment_factory=rollout.environment_factory,
        reward_funcs=[rollout_reward],
    )
    # -----------------------------------------------------------------------------------------
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    logged = [h for h in trainer.state.log_history if "rewards/rollout_reward/mean" in h]
    assert trainer.state.global_step == 2 and len(logged) == len(calls) == 2
    for (out, episodes, current), log in zip(calls, logged, strict=True):
        assert math.isfinite(log["loss"])
        # The engine sampled with the trainer's weights of that moment (they moved at step 1).
        for sampled, model, mask in zip(out["logprobs"], current, out["env_mask"], strict=True):
            trained = [(a, b) for a, b, m in zip(sampled, model, mask, strict=True) if m]
            assert trained and all(a == pytest.approx(b, abs=1e-4) for a, b in trained)
        rewards = [e.reward for e in episodes]
        assert out["episode_reward"] == rewards == [_replayed_reward(e) for e in episodes]
        assert log["rewards/rollout_reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
        # TRL counts only the tokens under our env_mask as the completion's length.
        lengths = [sum(mask) for mask in out["env_mask"]]
        assert log["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))
    # Some group's rewards differ (a parse failure among plain answers), so the policy moved.
    groups = [calls[0][0]["episode_reward"][i : i + 4] for i in range(0, 8, 4)]
    assert any(len(set(group)) > 1 for group in groups)
    assert any(
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )


def test_docstring_examples() -> None:
    import doctest

    from llm_gym.integrations.trl import rollout as trl_rollout

    result = doctest.testmod(trl_rollout)
    assert result.failed == 0 and result.attempted > 0
