"""Trajectories as data (llm_gym.eval.episode_files): what eval and the trainer write, read back
as hostile input, as a dataset, and rejection-sampling fine-tuning from the file."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import pytest

from llm_gym.cli import main as cli_main
from llm_gym.core.input_files import InputLimit
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import episode_files, run_and_report
from llm_gym.eval.episode_files import (
    EPISODE_FORMAT,
    episodes_dataset,
    read_episodes,
    sft_rows,
    write_episodes,
)


def _record(reward: float = 1.0, **fields: object) -> dict:
    """A minimal valid record: one question, one answer."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    return {"messages": messages, "reward": reward, "num_opening_messages": 1, **fields}


def _lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_eval_writes_one_record_per_episode_that_datasets_loads(tmp_path: Path) -> None:
    path = tmp_path / "eps.jsonl"
    report = run_and_report(
        "ToolUseGame-v0", "oracle", episodes=3, k=2, progress=False, print_report=False,
        save_episodes=path,
    )  # fmt: skip
    records = read_episodes(path)
    assert len(records) == len(report.episodes) == 2
    for record, episode in zip(records, report.episodes, strict=True):
        assert record["format"] == EPISODE_FORMAT
        assert (record["env_id"], record["env_version"]) == ("ToolUseGame-v0", "0")
        assert record["policy"] == {"name": "oracle"} and record["policy_version"] is None
        assert record["reward"] == episode.reward and record["truncation_cause"] is None
        assert record["tool_specs"] == episode.tool_specs and record["metrics"] == episode.metrics
        # the assistant turns are the raw text the model wrote, the replies keep their fields
        said = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert said == [turn.text for turn in episode.turns]
        assert "<tool_call>" in said[0] and record["turns"][0]["tool_calls"]
        tool = next(m for m in record["messages"] if m["role"] == "tool")
        assert tool["tool_call_id"] and tool["name"]
        assert record["samples"] == []  # a scripted policy samples no tokens
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    assert loaded.num_rows == 2 and loaded[0]["reward"] == records[0]["reward"]
    rows = episodes_dataset(path, min_reward=1)
    assert rows.num_rows == 2 and json.loads(rows[0]["tools"]) == records[0]["tool_specs"]
    assert rows[0]["action_format"] == "hermes"


def test_a_models_episodes_carry_token_ids_masks_and_logprobs(small_model_dir, tmp_path) -> None:
    path = tmp_path / "eps.jsonl"
    run_and_report(
        "GuessNumber-v0", f"hf:{small_model_dir}", episodes=1, max_turns=2, max_new_tokens=4,
        progress=False, print_report=False, save_episodes=path,
    )  # fmt: skip
    (record,) = read_episodes(path)
    assert record["policy"]["name"] == "hf" and record["samples"]
    for sample in record["samples"]:
        ids, mask = sample["completion_ids"], sample["env_mask"]
        assert sample["prompt_ids"] and len(ids) == len(mask) == len(sample["logprobs"])
        sampled = [lp for lp, m in zip(sample["logprobs"], mask, strict=True) if m]
        assert sampled and all(math.isfinite(lp) and lp <= 0 for lp in sampled)
    turn = record["turns"][0]
    assert turn["token_ids"] and len(turn["token_ids"]) == len(turn["logprobs"])


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "a JSON object is expected, got a JSON list"),
        ('{"messages": []}', "it needs 'messages' and 'reward'"),
        ('{"messages": [], "reward": NaN}', "'reward' must be a finite number"),
        ('{"messages": [], "reward": true}', "'reward' must be a finite number"),
        ('{"messages": {}, "reward": 1}', "'messages' must be a list"),
        ('{"messages": [{"role": 1}], "reward": 1}', "messages\\[0\\] must be an object"),
        ('{"messages": [{"role": "user", "content": 3}], "reward": 1}', "content must be"),
        ('{"messages": [], "reward": 1, "format": "other/9"}', "format 'other/9' is not"),
        ('{"messages": [], "reward": 1, "truncation_cause": "bored"}', "truncation_cause 'bored'"),
        ('{"messages": [], "reward": 1, "tool_specs": [1]}', "'tool_specs' must be a list"),
        ('{"messages": [], "reward": 1, "metrics": []}', "'metrics' must be an object"),
        ('{"messages": [], "reward": 1, "num_opening_messages": 3}', "outside \\[0, len"),
        (
            '{"messages": [], "reward": 1, "samples": [{"completion_ids": [1, 2], '
            '"env_mask": [1]}]}',
            "env_mask must be 0s and 1s, one per completion id",
        ),
        (
            '{"messages": [], "reward": 1, "samples": [{"completion_ids": [1], "env_mask": [2]}]}',
            "env_mask must be 0s and 1s",
        ),
        ('{"messages": [], "reward": 1, "samples": [{"prompt_ids": ["a"]}]}', "must be integers"),
        ("[" * 200 + "]" * 200, "nested more than 100 levels"),
    ],
)
def test_a_bad_line_is_refused_with_its_line_number(tmp_path: Path, line: str, reason: str) -> None:
    path = _lines(tmp_path / "eps.jsonl", json.dumps(_record()), "", line)
    with pytest.raises(InvalidArgumentError, match=f"eps.jsonl:3: not an episode record.*{reason}"):
        read_episodes(path)


def test_what_is_not_an_episodes_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bytes.jsonl").write_bytes(b'{"messages": [], "reward": 1}\n\xff\n')
    with pytest.raises(InvalidArgumentError, match="bytes.jsonl:2: not an episode record"):
        read_episodes(tmp_path / "bytes.jsonl")
    with pytest.raises(InvalidArgumentError, match="No such episodes file"):
        read_episodes(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgumentError, match="a folder without .jsonl files"):
        read_episodes(tmp_path / "empty")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgumentError, match="is a FIFO, not a regular file"):
        read_episodes(fifo)  # refused at once, never blocks
    big = _lines(tmp_path / "big.jsonl", *[json.dumps(_record())] * 50)
    monkeypatch.setattr(episode_files, "_LIMIT", InputLimit("episodes file", 1000, "X"))
    with pytest.raises(InvalidArgumentError, match="larger than 1,000 bytes"):
        read_episodes(big)


def test_a_folder_is_read_in_name_order_and_its_total_is_bounded(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "steps"
    folder.mkdir()
    write_episodes(folder / "step-000002.jsonl", [_record(0.5)])
    write_episodes(folder / "step-000001.jsonl", [_record(1.0), _record(0.0)])
    (folder / "notes.txt").write_text("not read")
    assert [r["reward"] for r in read_episodes(folder)] == [1.0, 0.0, 0.5]
    sizes = sorted(p.stat().st_size for p in folder.glob("*.jsonl"))
    limit = sizes[-1] + 1  # each file is under it, not both together
    monkeypatch.setattr(episode_files, "_LIMIT", InputLimit("episodes file", limit, "X"))
    with pytest.raises(InvalidArgumentError, match=f"larger than {limit:,} bytes"):
        read_episodes(folder)


def test_min_reward_keeps_the_episodes_that_reached_it() -> None:
    records = [
        _record(1.0, task_id="a"),
        _record(0.5, task_id="b"),
        _record(2.0, task_id="c", error="Traceback ..."),  # broken: never a demonstration
        {**_record(1.0, task_id="d"), "messages": [{"role": "user", "content": "q"}]},
    ]
    assert [r["task_id"] for r in sft_rows(records, min_reward=1)] == ["a"]
    assert [r["task_id"] for r in sft_rows(records)] == ["a", "b"]
    assert sft_rows(records)[0]["messages"][1] == {"role": "assistant", "content": "42"}
    with pytest.raises(InvalidArgumentError, match="min_reward must be a finite number"):
        sft_rows(records, min_reward=float("nan"))
    pytest.importorskip("datasets")
    with pytest.raises(InvalidArgumentError, match="none of the 4 episodes reached min_reward=3"):
        episodes_dataset(records, min_reward=3)


def test_the_cli_saves_episodes_and_hands_sft_to_the_train_extra(tmp_path: Path, capsys) -> None:
    path = tmp_path / "eps.jsonl"
    out = io.StringIO()
    argv = ["eval", "GuessNumber-v0", "--episodes", "2", "--no-progress", "--save-episodes"]
    assert cli_main([*argv, str(path)], out=out) == 0
    assert f"wrote {path}" in out.getvalue() and len(read_episodes(path)) == 2
    assert cli_main([*argv, str(tmp_path)], out=io.StringIO()) == 2  # a folder: refused first
    assert "save_episodes must be a file path" in capsys.readouterr().err
    pytest.importorskip("trl")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["sft", "--help"], out=io.StringIO())
    assert exit_info.value.code == 0 and "--from-episodes" in capsys.readouterr().out
    argv = ["sft", "--from-episodes", str(tmp_path / "none.jsonl"), "--min-reward", "1"]
    assert cli_main(argv, out=io.StringIO()) == 2
    assert "No such episodes file" in capsys.readouterr().err


def test_the_trainer_names_each_steps_file_and_its_environment(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from llm_gym.core.registry import entry_of_factory, env_entry
    from trainers.grpo.rollouts import save_step_episodes

    episodes = run_and_report(
        "GuessNumber-v0", "oracle", episodes=2, progress=False, print_report=False
    ).episodes
    factory = env_entry("GuessNumber-v0").env_factory()
    assert entry_of_factory(factory) is env_entry("GuessNumber-v0")
    path = save_step_episodes(tmp_path / "eps", 3, episodes, factory, {"name": "hf"})
    assert path == tmp_path / "eps" / "step-000003.jsonl"
    records = read_episodes(tmp_path / "eps")
    assert [r["policy_version"] for r in records] == [2, 2]
    assert {(r["env_id"], r["env_version"]) for r in records} == {("GuessNumber-v0", "0")}
    assert entry_of_factory(lambda task: None) is None  # a factory of the user's own
    path = save_step_episodes(tmp_path / "own", 1, episodes, _own_factory, {"name": "hf"})
    assert {r["env_id"] for r in read_episodes(path)} == {"_own_factory"}


GRPO = {"episodes_per_task": 2, "use_cpu": True}


def _own_factory(task):  # an env factory that no registration built
    raise AssertionError("never called")


def test_the_config_entries_refuse_what_cannot_run(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from trainers import GRPOConfig
    from trainers.pipeline.sft import check_sft_source
    from trainers.sft.settings import SFTSettings

    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(InvalidArgumentError, match="save_episodes must be None or a folder"):
        GRPOConfig(output_dir=str(tmp_path), max_turns=1, save_episodes=str(file), **GRPO)
    config = GRPOConfig(output_dir=str(tmp_path), max_turns=1, save_episodes=tmp_path / "e", **GRPO)
    assert config.save_episodes == str(tmp_path / "e")
    with pytest.raises(InvalidArgumentError, match="sft.from_episodes .* go with sft.source"):
        SFTSettings(source="episodes")
    with pytest.raises(InvalidArgumentError, match="go with sft.source 'episodes'"):
        SFTSettings(min_reward=1.0)
    with pytest.raises(InvalidArgumentError, match="sft.min_reward must be a finite number"):
        SFTSettings(source="episodes", from_episodes="x", min_reward=float("inf"))
    from llm_gym.core.registry import env_entry

    entry = env_entry("GuessNumber-v0")
    with pytest.raises(InvalidArgumentError, match="sft.from_episodes 'missing' does not exist"):
        check_sft_source(SFTSettings(source="episodes", from_episodes="missing"), entry)
    with pytest.raises(InvalidArgumentError, match="sft.oracle sets a demonstrator"):
        check_sft_source(
            SFTSettings(source="episodes", from_episodes=str(file), oracle="x:y"), entry
        )


def test_rejection_sampling_fine_tuning_closes_the_loop(small_model_dir, tmp_path) -> None:
    """Collect (the oracle, and a random policy that fails), save, SFT the tiny model on the
    episodes that reached reward 1, evaluate the result."""
    pytest.importorskip("trl")
    folder = tmp_path / "episodes"
    for policy in ("oracle", "random"):
        run_and_report("GuessNumber-v0", policy, episodes=6, progress=False, print_report=False,
                       save_episodes=folder / f"{policy}.jsonl")  # fmt: skip
    records = read_episodes(folder)
    kept = [r for r in records if r["reward"] >= 1]
    assert 0 < len(kept) < len(records)  # the filter has something to do
    out, model = io.StringIO(), tmp_path / "rft"
    argv = ["sft", "--from-episodes", str(folder), "--min-reward", "1", "--model",
            str(small_model_dir), "--output", str(model), "--max-steps", "3", "--batch-size", "4",
            "--learning-rate", "1e-2", "--no-progress"]  # fmt: skip
    assert cli_main(argv, out=out) == 0
    assert out.getvalue().splitlines()[-1] == str(model)
    info = json.loads((model / "sft_info.json").read_text())
    assert info["examples"] == len(kept) and info["steps"] == 3
    report = run_and_report("GuessNumber-v0", f"hf:{model}", episodes=2, max_turns=2,
                            progress=False, print_report=False)  # fmt: skip
    assert len(report.episodes) == 2 and not any(e.error for e in report.episodes)


def test_a_training_run_saves_each_steps_episodes(small_model_dir, tmp_path) -> None:
    pytest.importorskip("trl")
    from llm_gym.core.registry import env_entry
    from trainers import GRPOConfig, train_multi_turn

    entry = env_entry("GuessNumber-v0")
    config = GRPOConfig(
        output_dir=str(tmp_path / "run"), model=str(small_model_dir), batch_size=2,
        episodes_per_task=2, num_steps=2, max_turns=2, max_model_length=512,
        max_tokens_per_turn=4, save_strategy="no", report_to="none", use_cpu=True,
        save_episodes=str(tmp_path / "episodes"),
    )  # fmt: skip
    train_multi_turn(config, tasks=entry.tasks("train")[:4], env_factory=entry.env_factory())
    files = sorted(p.name for p in (tmp_path / "episodes").iterdir())
    assert files == ["step-000001.jsonl", "step-000002.jsonl"]
    records = read_episodes(tmp_path / "episodes")
    assert len(records) == 8 and [r["policy_version"] for r in records] == [0] * 4 + [1] * 4
    assert {(r["env_id"], r["env_version"]) for r in records} == {("GuessNumber-v0", "0")}
    assert records[0]["policy"] == {"name": "hf", "model": str(small_model_dir)}
    assert all(r["samples"] and r["samples"][0]["logprobs"] for r in records)
