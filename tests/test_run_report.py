"""llm_gym.eval.run_report on a synthetic run folder: what the page holds, hostile files, the CLI;
llm_gym.eval.episode_records on a played episode."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.run_report import MAX_REPORT_EPISODES, load_run, write_run_report


def _episode(kind: str, success: bool, ended: str = "terminated", text: str = "ok") -> dict:
    return {
        "task_id": f"{kind}-1",
        "kind": kind,
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "target": "4",
        "reward": 1.0 if success else 0.0,
        "success": success,
        "ended": ended,
        "turns": [
            {
                "text": text,
                "parse": "final_answer",
                "tool_calls": 0,
                "finish_reason": "stop",
                "reward": 0.5,
                "env": [{"role": "tool", "content": "4"}],
            }
        ],
        "samples": [[["<|user|>2+2", 0], ["4", 1]]],
    }


def write_run(folder: Path, episodes: list[dict] | None = None) -> Path:
    """A run folder as train.py leaves it, written by hand: three steps, one health check."""
    folder.mkdir(parents=True, exist_ok=True)
    steps = [
        {"step": 1, "reward": 0.1, "episodes/tool_calls_mean": 2.0, "entropy": 0.5},
        {"step": 2, "reward": 0.3, "episodes/tool_calls_mean": 1.0, "truncated_ratio": 0.2},
        {"step": 3, "reward": 0.5, "val/success_rate": 0.4, "health/entropy_collapse": 0.01},
    ]
    (folder / "step_log.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = {
        "env": "ToolUseGame-v0",
        "total_seconds": 120.0,
        "health": [
            {
                "step": 3,
                "check": "entropy_collapse",
                "value": 0.01,
                "detail": "entropy 0.0100",
                "cause": "a collapsed policy",
                "remedy": "a lower learning rate",
            }
        ],
        "evaluation": {
            "split": "val",
            "greedy": {
                "tasks": 2,
                "success_before": 0.25,
                "success_after": 0.75,
                "gain": 0.5,
                "gain_ci": [0.1, 0.9],
            },
        },
        "task_success": {"a": 1.0},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.json").write_text(json.dumps({"env": "ToolUseGame-v0", "model": "tiny"}))
    metrics = {
        "episodes": 2.0,
        "success_rate": 0.75,
        "success_ci_low": 0.3,
        "success_ci_high": 0.95,
        "reward_mean": 0.7,
    }
    (folder / "eval_after_grpo.json").write_text(json.dumps({"metrics": metrics}))
    rows = episodes or [_episode("lookup", True), _episode("compare", False, "max_turns")]
    (folder / "episodes_after_grpo.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rows))
    return folder


def _data(page: str) -> dict:
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_the_page_holds_the_run_inline(tmp_path) -> None:
    path = write_run_report(write_run(tmp_path / "run"))
    assert path == tmp_path / "run" / "report.html"
    page = path.read_text()
    assert "<script src" not in page and "http" not in page.replace(
        "http://www.w3.org/2000/svg", ""
    )  # no CDN, nothing fetched
    data = _data(page)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    assert data["health"][0]["check"] == "entropy_collapse" and data["health"][0]["remedy"]
    assert data["evaluations"]["after_grpo"]["metrics"]["success_rate"] == 0.75
    assert data["episodes"]["after_grpo"]["total"] == 2
    assert "task_success" not in data["summary"]  # per-task tables stay in summary.json
    assert data["config"]["model"] == "tiny"


def test_episode_text_cannot_end_the_data_script(tmp_path) -> None:
    hostile = "</script><script>alert(1)</script><!-- & -->"
    run = write_run(tmp_path / "run", [_episode("lookup", True, text=hostile)])
    page = write_run_report(run).read_text()
    assert hostile not in page and page.count("</script>") == 2  # the data's and the code's
    assert _data(page)["episodes"]["after_grpo"]["shown"][0]["turns"][0]["text"] == hostile


def test_non_finite_numbers_become_null_and_bad_lines_are_skipped(tmp_path) -> None:
    run = write_run(tmp_path / "run")
    with (run / "step_log.jsonl").open("a") as log:
        log.write(json.dumps({"step": 4, "loss": math.nan, "grad_norm": math.inf}) + "\n")
        log.write('{"step": 5, "loss": 0.1\n')  # the line a killed run leaves half-written
        log.write("[1, 2]\n")
    data = load_run(run)
    assert data["steps"][-1] == {"step": 4, "loss": None, "grad_norm": None}
    assert "step_log.jsonl: 2 unreadable line(s) skipped" in data["notes"]
    json.dumps(data, allow_nan=False)  # what the page embeds is strict JSON


def test_an_episode_file_longer_than_the_page_holds_is_cut_and_counted(tmp_path) -> None:
    rows = [_episode("lookup", i % 2 == 0) for i in range(MAX_REPORT_EPISODES + 5)]
    data = load_run(write_run(tmp_path / "run", rows))
    assert len(data["episodes"]["after_grpo"]["shown"]) == MAX_REPORT_EPISODES
    assert data["episodes"]["after_grpo"]["total"] == MAX_REPORT_EPISODES + 5


def test_the_step_log_falls_back_to_the_newest_trainer_state(tmp_path) -> None:
    run = tmp_path / "run"
    checkpoint = run / "grpo" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    history = {"log_history": [{"step": 1, "reward": 0.2}, {"step": 2, "health/x": 1.0}]}
    (checkpoint / "trainer_state.json").write_text(json.dumps(history))
    data = load_run(run)
    assert [s["step"] for s in data["steps"]] == [1, 2]
    assert data["health"] == [{"step": 2, "check": "x", "value": 1.0}]


@pytest.mark.parametrize("make", ["missing", "empty", "file"])
def test_a_folder_without_a_run_is_refused_with_what_was_expected(tmp_path, make) -> None:
    path = tmp_path / "run"
    if make == "empty":
        path.mkdir()
    elif make == "file":
        path.write_text("x")
    with pytest.raises(InvalidArgumentError, match="summary.json|not a folder"):
        load_run(path)


def test_llm_gym_report_writes_the_page_and_prints_its_path(tmp_path) -> None:
    import io

    from llm_gym.cli import main

    out = io.StringIO()
    target = tmp_path / "page.html"
    assert main(["report", str(write_run(tmp_path / "run")), "--output", str(target)], out) == 0
    assert out.getvalue().strip() == str(target) and target.read_text().startswith("<!DOCTYPE")
    assert main(["report", str(tmp_path / "nothing")], io.StringIO()) == 2  # one line, exit 2


def test_an_episode_record_tells_trained_tokens_from_context() -> None:
    from llm_gym.core.registry import env_entry
    from llm_gym.eval.episode_records import episode_record
    from llm_gym.policies import policy_from_spec
    from llm_gym.rollout.loop import collect_groups

    entry = env_entry("ToolUseGame-v0")
    [[episode]] = collect_groups(
        entry.env_factory(),
        entry.tasks("val")[:1],
        policy_from_spec("oracle"),
        episodes_per_task=1,
        max_turns=entry.max_turns,
        oracle=entry.oracle(),
    )
    record = episode_record(episode)
    assert record["success"] and record["ended"] == "terminated"
    assert record["turns"][0]["text"] == episode.turns[0].text
    assert record["turns"][0]["env"] == [
        {"role": m["role"], "content": m["content"]} for m in episode.turns[0].env_messages
    ]
    assert record["kind"] == episode.task.metadata["type"]
    json.dumps(record, allow_nan=False)


def _chromium(*args: str) -> str:
    import subprocess

    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.mark.slow
def test_a_tiny_runs_report_reads_in_headless_chromium(small_model_dir, tmp_path) -> None:
    """The report of a real (tiny) train.py run, rendered by Debian's chromium as a person opens
    it: its text, its curves, and the episode browser's filters."""
    import shutil

    if shutil.which("chromium") is None:
        pytest.skip("no chromium on PATH (Debian's chromium package renders the page)")
    pytest.importorskip("trl")
    from trainers.pipeline.run import load_config, run_pipeline

    out = tmp_path / "run"
    config = tmp_path / "job.yaml"
    config.write_text(
        f"""
env: ToolUseGame-v0
model: {small_model_dir}
output_dir: {out}
val_tasks: 2
grpo:
  batch_size: 2
  episodes_per_task: 2
  num_steps: 2
  max_turns: 2
  max_model_length: 1024
  max_tokens_per_turn: 8
  validation_interval: 1
  keep_best: val/success_rate
  logging_steps: 1
  report_to: none
  save_strategy: "no"
evaluation:
  episodes: 6
  samples: 0
  max_new_tokens: 8
"""
    )
    run_pipeline(load_config(config))
    page = out / "report.html"
    dom = _chromium("--dump-dom", page.as_uri())
    assert "Run report: run" in dom and "held-out success (paired by task)" in dom
    assert dom.count('class="chart"') >= 4  # reward, tool use, lengths, truncation, ...
    assert "No health check fired." in dom
    assert "Model after GRPO: the weights of step" in dom  # keep_best's point, named
    assert "6 of 6 episodes shown" in dom
    episodes = load_run(out)["episodes"]["after_grpo"]["shown"]
    failures = sum(not e["success"] for e in episodes)
    filtered = _chromium("--dump-dom", page.as_uri() + "#eval=after_grpo&outcome=failure")
    assert f"{failures} of 6 episodes shown" in filtered
    assert filtered.count('data-outcome="failure"') == failures
    assert 'data-outcome="success"' not in filtered
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri())
    assert shot.stat().st_size > 10_000
