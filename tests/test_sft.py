"""Multi-turn SFT warm start (trainers/sft/train.py): data format, the loss mask against the RL
side's env_mask, a short training run, and document 002's SFT hook."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym import Task  # noqa: E402
from llm_gym.datasets import TaskExample  # noqa: E402
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks, oracle_action  # noqa: E402
from llm_gym.policies import Generation, OraclePolicy, Policy, PolicyRequest  # noqa: E402
from llm_gym.rollout import collect_groups, episode_to_samples  # noqa: E402
from tests.seeds.agent_env import AgentEnv  # noqa: E402
from trainers.chat_template import (  # noqa: E402
    RL_ALIGNED_QWEN2_5_TEMPLATE,
    rl_aligned_chat_template,
)
from trainers.sft.data import (  # noqa: E402
    oracle_sft_dataset,
    sft_dataset_from_multi_turn,
    short_context_dataset,
)
from trainers.sft.settings import SFTSettings  # noqa: E402
from trainers.sft.train import build_sft_run, sft_warm_start  # noqa: E402

ONE_STEP = SFTSettings(max_steps=1, progress=False)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def _tasks() -> list[Task]:
    """One training task of each kind (one, two and three turns; compare answers a name)."""
    by_type: dict[str, Task] = {}
    for task in get_tasks("train"):
        by_type.setdefault(task.metadata["type"], task)
    return list(by_type.values())


def _oracle_episodes(tasks: Sequence[Task]):
    groups = collect_groups(
        ToolUseGameEnv, tasks, OraclePolicy(), max_turns=8, oracle=oracle_action
    )
    return [group[0] for group in groups]


def _label_mask(row) -> list[int]:
    return [int(label != -100) for label in row["labels"]]


def test_oracle_dataset_format() -> None:
    tasks = _tasks()
    dataset = oracle_sft_dataset("ToolUseGame-v0", tasks)
    assert len(dataset) == len(tasks)
    assert {"messages", "tools"} <= set(dataset.column_names)
    episodes = _oracle_episodes(tasks)
    specs = [dict(s) for s in ToolUseGameEnv().tool_specs]
    for row, episode in zip(dataset, episodes, strict=True):
        assert json.loads(row["tools"]) == specs
        messages = row["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[1]["content"] == episode.task.prompt
        assistant = [m for m in messages if m["role"] == "assistant"]
        # the raw text the oracle's action was rendered to, no structured tool calls
        assert [m["content"] for m in assistant] == [t.text for t in episode.turns]
        assert all("tool_calls" not in m for m in messages)
        assert assistant[0]["content"].startswith("<tool_call>\n{")
        assert assistant[-1]["content"] == str(episode.task.target)
        tool_messages = [m for m in messages if m["role"] == "tool"]
        assert tool_messages and all(m["name"] in {"lookup", "calculator"} for m in tool_messages)
    # episodes= cycles the tasks; a factory needs tasks and an oracle
    assert len(oracle_sft_dataset("ToolUseGame-v0", tasks[:2], episodes=5)) == 5
    factory_rows = oracle_sft_dataset(ToolUseGameEnv, tasks[:2], oracle=oracle_action)
    assert factory_rows[0]["messages"] == dataset[0]["messages"]


def test_sft_labels_are_exactly_the_rl_env_mask(small_model_dir, small_model, tmp_path) -> None:
    _, tokenizer = small_model
    tasks = _tasks()
    dataset = oracle_sft_dataset("ToolUseGame-v0", tasks)
    rl = build_sft_run(small_model_dir, tmp_path, dataset, ONE_STEP).trainer
    trl_mask = dataclasses.replace(ONE_STEP, loss_mask="trl")
    trl = build_sft_run(small_model_dir, tmp_path, dataset, trl_mask).trainer
    newline = tokenizer.encode("\n", add_special_tokens=False)
    for index, episode in enumerate(_oracle_episodes(tasks)):
        (sample,) = episode_to_samples(episode, tokenizer)
        ids = sample.prompt_ids + sample.completion_ids
        env_mask = [0] * len(sample.prompt_ids) + sample.env_mask
        row = rl.train_dataset[index]
        # the same token sequence, plus the template's "\n" after the last <|im_end|>
        assert row["input_ids"] == ids + newline
        # the loss covers exactly the tokens RL trains (assistant text and its <|im_end|>)
        assert _label_mask(row) == [*env_mask, 0]
        # TRL's own training template also trains the "\n" before and after each assistant turn
        trl_row = trl.train_dataset[index]
        assert trl_row["input_ids"] == row["input_ids"]
        extra = [
            i
            for i, (a, b) in enumerate(zip(_label_mask(trl_row), _label_mask(row), strict=True))
            if a != b
        ]
        assert all(_label_mask(trl_row)[i] == 1 for i in extra)
        assert [row["input_ids"][i] for i in extra] == newline * (2 * episode.num_turns)


def test_shared_prefix_gives_the_same_loss_and_gradients(small_model_dir, tmp_path) -> None:
    from trainers.grpo.shared_prefix import shared_prefix_inputs

    dataset = oracle_sft_dataset("ToolUseGame-v0", _tasks())
    results = []
    for shared in (False, True):
        settings = dataclasses.replace(ONE_STEP, shared_prefix=shared)
        trainer = build_sft_run(small_model_dir, tmp_path, dataset, settings).trainer
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(dataset))])
        count = (batch["labels"][:, 1:] != -100).sum()
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=count)
        loss.backward()
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        results.append((float(loss.detach()), grads, trainer._metrics["train"]["num_tokens"]))
    split = shared_prefix_inputs(trainer.model, dict(batch), 32)
    assert "shift_labels" in split  # the system prompt and tool specs ran once
    assert split["input_ids"].shape[1] < batch["input_ids"].shape[1] // 2
    (plain_loss, plain_grads, plain_tokens), (loss, grads, tokens) = results
    assert loss == pytest.approx(plain_loss, rel=1e-5) and tokens == plain_tokens
    for a, b in zip(plain_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_length_chunks_give_the_same_loss_gradients_and_metrics(small_model_dir, tmp_path) -> None:
    """Short-context rows (no shared prefix) run in chunks of similar length: the same loss,
    gradients and logged metrics as one padded batch."""
    from unittest import mock

    from trainers.grpo.length_chunks import LengthChunkedLM
    from trainers.sft.labelled_head import labelled_head_forward

    dataset = short_context_dataset(oracle_sft_dataset("ToolUseGame-v0", _tasks()))
    results = []
    for chunked in (False, True):
        settings = dataclasses.replace(ONE_STEP, length_chunked=chunked)
        trainer = build_sft_run(small_model_dir, tmp_path, dataset, settings).trainer
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(dataset))])
        count = (batch["labels"][:, 1:] != -100).sum()
        trainer.model.train()
        with (
            mock.patch.object(LengthChunkedLM, "__call__", autospec=True,
                              side_effect=LengthChunkedLM.__call__) as called,
            mock.patch("trainers.sft.train.labelled_head_forward",
                       side_effect=labelled_head_forward) as head,
        ):  # fmt: skip
            loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=count)
        assert called.called == chunked and head.called == chunked  # and the labelled head
        loss.backward()
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        results.append((float(loss.detach()), grads, metrics))
    lengths = batch["attention_mask"].sum(dim=1)
    assert int(lengths.min()) < int(lengths.max())  # padding that the chunks leave out
    (plain_loss, plain_grads, plain_metrics), (loss, grads, metrics) = results
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    assert metrics.keys() == plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5), key
    for a, b in zip(plain_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert not LengthChunkedLM.applies({**batch, "position_ids": batch["input_ids"]})
    # TRL's full-logits paths (label smoothing here) call the model without labels: no chunks.
    smoothing = dataclasses.replace(
        ONE_STEP, shared_prefix=False, trl_options={"label_smoothing_factor": 0.1}
    )
    smoothed = build_sft_run(small_model_dir, tmp_path, dataset, smoothing).trainer
    smoothed.model.train()
    assert torch.isfinite(smoothed.compute_loss(smoothed.model, dict(batch)))


def test_rl_aligned_template_renders_the_original_text(small_model) -> None:
    _, tokenizer = small_model
    assert rl_aligned_chat_template(tokenizer) == RL_ALIGNED_QWEN2_5_TEMPLATE

    class Other:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

        def apply_chat_template(self, messages, chat_template=None, **kwargs):
            return tokenizer.apply_chat_template(messages, chat_template=chat_template, **kwargs)

    assert rl_aligned_chat_template(Other()) is None


def test_short_sft_run_lowers_the_loss_and_saves(small_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dataset = oracle_sft_dataset("ToolUseGame-v0", _tasks())
    settings = SFTSettings(
        learning_rate=1e-2,
        max_steps=3,
        batch_size=len(dataset),
        lr_scheduler_type="constant",
        warmup_steps=0,
        progress=False,
    )
    trainer = build_sft_run(small_model_dir, tmp_path / "probe", dataset, settings).trainer
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(dataset))])

    def loss(model) -> float:
        with torch.no_grad():
            return float(model(**batch).loss)

    before = loss(trainer.model)
    out = sft_warm_start(small_model_dir, tmp_path / "sft", dataset, settings)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert loss(model) < before
    info = json.loads((out / "sft_info.json").read_text())
    assert info["steps"] == 3 and not info["stopped_by_time_budget"]
    assert info["settings"] == dataclasses.asdict(settings)
    # the saved tokenizer keeps the original template (no generation markers)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(small_model_dir).chat_template
    assert "{%- generation %}" not in tokenizer.chat_template


def test_time_budget_stops_training(small_model_dir, tmp_path, capsys) -> None:
    dataset = oracle_sft_dataset("ToolUseGame-v0", _tasks())
    settings = SFTSettings(max_steps=50, batch_size=2, time_budget_s=1e-3, progress=False)
    out = sft_warm_start(small_model_dir, tmp_path, dataset, settings)
    info = json.loads((out / "sft_info.json").read_text())
    assert info["steps"] == 1 and info["stopped_by_time_budget"]
    assert "stopped by time_budget_s=0.001 after 1 of 50 steps" in capsys.readouterr().err


def test_the_short_context_phase_runs_first_and_shares_the_budget(monkeypatch, tmp_path) -> None:
    """Both phases from one record: the short-context rows (without system prompt and tool
    specs) for ``short_context_steps`` steps in ``<output_dir>_short_context``, then the full
    rows from that model, no second warmup, the rest of the time budget."""
    phases: list[tuple[str, str, list, SFTSettings]] = []

    def train_phase(model_path, output_dir, dataset, settings, **context) -> Path:
        assert context == {"seed": 3, "action_format": "hermes", "chat_template": None,
                           "health_action": "stop"}  # fmt: skip
        phases.append((str(model_path), output_dir.name, list(dataset), settings))
        return output_dir

    monkeypatch.setattr("trainers.sft.train._train_phase", train_phase)
    full = oracle_sft_dataset("ToolUseGame-v0", _tasks())
    short = oracle_sft_dataset("ToolUseGame-v0", _tasks()[:1])
    settings = SFTSettings(short_context_steps=2, max_steps=6, warmup_steps=3, time_budget_s=40)
    out = sft_warm_start("base", tmp_path / "sft", full, settings, short_dataset=short, seed=3,
                         action_format="hermes", health_action="stop")  # fmt: skip
    assert out == tmp_path / "sft"
    (base, first_dir, first_rows, first), (start, second_dir, second_rows, second) = phases
    assert (base, first_dir, second_dir) == ("base", "sft_short_context", "sft")
    assert start == str(tmp_path / "sft_short_context")  # the full phase trains the first's model
    assert first_rows == list(short_context_dataset(short)) and second_rows == list(full)
    assert all(m["role"] != "system" for row in first_rows for m in row["messages"])
    # 2 of 8 steps: a quarter of the 40 s; the full phase has the rest (the fake phase is instant)
    assert (first.max_steps, first.lr_scheduler_type, first.warmup_steps) == (2, "constant", 3)
    assert first.time_budget_s == 10.0 and second.time_budget_s == pytest.approx(40, abs=1)
    assert (second.max_steps, second.lr_scheduler_type, second.warmup_steps) == (6, "cosine", 0)
    phases.clear()
    sft_warm_start("base", tmp_path / "one", full, SFTSettings(max_steps=6), seed=3,
                   action_format="hermes", health_action="stop")  # fmt: skip
    assert [(p[1], p[3]) for p in phases] == [("one", SFTSettings(max_steps=6))]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (SFTSettings(short_context_steps=1), "build_sft_run builds one phase"),
        (SFTSettings(trl_options={"max_steps": 9}), "names 'max_steps', and the warm start sets"),
        (SFTSettings(trl_options={"label_smothing": 0.1}), "SFTConfig has no such field"),
    ],
)
def test_a_run_it_cannot_build_is_refused_before_the_model_loads(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_sft_run("no/such/model", "unused", None, settings)


class _Replay(Policy):
    """Plays fixed assistant texts, one per turn."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        return [
            Generation(text=self.texts[sum(m["role"] == "assistant" for m in r.messages[2:])])
            for r in requests
        ]


def test_document_002_hook_matches_the_rl_side(small_model_dir, small_model, tmp_path) -> None:
    _, tokenizer = small_model
    get = '<tool_call>{"name": "get_order", "args": {"order_id": "A1001"}}</tool_call>'
    refund = '<tool_call>{"name": "refund_order", "args": {"order_id": "A1001"}}</tool_call>'
    texts = [get, refund, "Refunded."]
    env = AgentEnv()
    task = Task("Refund my last order.", target="refund_order")
    (episode,) = collect_groups(env, [task], _Replay(texts), max_turns=8)[0]
    assert episode.reward == 1.0
    transcript = episode.messages[episode.num_opening_messages :]  # the target transcript
    examples = [
        TaskExample(input="Refund my last order.", output=transcript),
        {"input": "Hi", "output": "Hello."},
    ]
    dataset = sft_dataset_from_multi_turn(env, examples, prompt_text="")
    assert dataset[1]["messages"][-1] == {"role": "assistant", "content": "Hello."}
    assert json.loads(dataset[0]["tools"]) == []
    trainer = build_sft_run(small_model_dir, tmp_path, dataset, ONE_STEP).trainer
    row = trainer.train_dataset[0]
    (sample,) = episode_to_samples(episode, tokenizer)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert row["input_ids"] == sample.prompt_ids + sample.completion_ids + newline
    assert _label_mask(row) == [0] * len(sample.prompt_ids) + sample.env_mask + [0]
    trained = tokenizer.decode(
        [i for i, m in zip(row["input_ids"], _label_mask(row), strict=True) if m]
    )
    assert trained == "".join(t + "<|im_end|>" for t in texts)


class _JudgedFailedEnv(ToolUseGameEnv):
    """ToolUseGame whose final step flags every episode failed, at the full reward."""

    async def step(self, action):  # type: ignore[no-untyped-def]
        result = await super().step(action)
        if result.terminated:
            result.metrics = {**result.metrics, "success": False}
        return result


def test_only_successful_follows_the_env_judgement() -> None:
    tasks = _tasks()[:2]
    with pytest.raises(ValueError, match="every transcript was filtered out"):
        oracle_sft_dataset(_JudgedFailedEnv, tasks, oracle=oracle_action)  # reward 1.0, flag False
    kept = oracle_sft_dataset(_JudgedFailedEnv, tasks, oracle=oracle_action, only_successful=False)
    assert len(kept) == 2 and all(row["reward"] == 1.0 for row in kept)
