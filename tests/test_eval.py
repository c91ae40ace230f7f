"""Evaluation numbers against hand computation, and run_and_report end to end."""

from __future__ import annotations

import json
import math

import pytest

from llm_gym import InvalidArgumentError
from llm_gym.eval import mean_pass_at_k, pass_at_k, run_and_report, select_tasks, wilson_interval
from llm_gym.eval.metrics import format_rate
from llm_gym.policies import Generation, Policy


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 1 - 3 / 6),  # C(3,2)/C(4,2) = 3/6
        (5, 2, 2, 1 - 3 / 10),  # C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)/C(10,5)
        (4, 0, 3, 0.0),
        (4, 4, 1, 1.0),
        (3, 2, 2, 1.0),  # n - c < k
        (8, 1, 1, 1 / 8),
    ],
)
def test_pass_at_k_by_hand(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(InvalidArgumentError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(InvalidArgumentError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)
    assert mean_pass_at_k([(4, 1), (4, 4)], 2) == pytest.approx((0.5 + 1.0) / 2)


def test_wilson_interval_by_hand() -> None:
    # p = 0.8, n = 10, z = 1.96: centre = (0.8 + 0.19208) / 1.38416, half = 1.96 *
    # sqrt(0.016 + 0.009604) / 1.38416
    z = 1.959964
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert wilson_interval(8, 10) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(200, 200)
    assert high == 1.0 and 0.98 < low < 0.99


def test_select_tasks_is_seeded() -> None:
    tasks = list(range(100))
    assert select_tasks(tasks, None, 0) == tasks
    assert select_tasks(tasks, 10, 3) == select_tasks(tasks, 10, 3)
    assert select_tasks(tasks, 10, 3) != select_tasks(tasks, 10, 4)


def test_run_and_report_oracle_and_random(tmp_path) -> None:
    oracle = run_and_report(
        "ToolUseGame-v0",
        "oracle",
        episodes=40,
        progress=False,
        print_report=False,
        output=tmp_path / "o.json",
    )
    assert oracle.metrics["success_rate"] == 1.0 and oracle.metrics["pass_at_k"] == 1.0
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["env_id"] == "ToolUseGame-v0" and record["env_version"] == "0"
    assert record["split"] == "val" and record["tasks"] == 40 and "episodes" not in record
    rand = run_and_report(
        "ToolUseGame-v0", "random:1", episodes=40, k=4, progress=False, print_report=False
    )
    assert rand.tasks == 10 and rand.metrics["episodes"] == 40
    assert rand.metrics["success_rate"] < 0.1
    assert "success rate" in rand.format_table()
    # success per kind of task: ToolUseGame's tasks name theirs
    kinds = {e.task.metadata["type"] for e in oracle.episodes}
    assert set(record["by_type"]) == kinds and len(kinds) >= 3
    assert sum(v["episodes"] for v in record["by_type"].values()) == 40
    assert all(v["success_rate"] == 1.0 for v in oracle.by_type.values())
    assert "  on lookup_arith" in oracle.format_table()


def test_success_by_type_counts_each_named_kind() -> None:
    from types import SimpleNamespace as NS

    from llm_gym.eval import success_by_type

    def episode(metadata, reward):
        return NS(task=NS(metadata=metadata), reward=reward, metrics={})

    episodes = [
        episode({"type": "compare"}, 1.0),
        episode({"type": "compare"}, 0.0),
        episode({"type": "compare"}, 1.0),
        episode({"type": "lookup"}, 0.5),
        episode({"type": 3}, 1.0),  # not a name: not counted
        episode({}, 1.0),
    ]
    assert success_by_type(episodes) == {
        "compare": {"episodes": 3.0, "success_rate": 2 / 3},
        "lookup": {"episodes": 1.0, "success_rate": 0.0},
    }
    assert success_by_type(episodes, threshold=0.5)["lookup"]["success_rate"] == 1.0
    assert success_by_type([episode({}, 1.0)]) == {}


def test_cli_eval_writes_a_record(tmp_path) -> None:
    import io

    from llm_gym.cli import main

    out = io.StringIO()
    path = tmp_path / "r.json"
    code = main(
        [
            "eval",
            "ToolUseGame-v0",
            "--policy",
            "oracle",
            "--episodes",
            "10",
            "--no-progress",
            "--output",
            str(path),
        ],
        out=out,
    )
    assert code == 0 and "success rate" in out.getvalue()
    assert json.loads(path.read_text())["metrics"]["success_rate"] == 1.0


def test_cli_eval_reads_the_tasks_with_task_options(tmp_path) -> None:
    """``--task-option world_seed=1``: ToolUseGame's questions in another world (the oracle,
    which reads its tool results, still succeeds); a bad option is a clear error."""
    import io

    from llm_gym.cli import main

    path = tmp_path / "r.json"
    argv = ["eval", "ToolUseGame-v0", "--episodes", "6", "--no-progress", "--output", str(path)]
    assert main([*argv, "--task-option", "world_seed=1"], out=io.StringIO()) == 0
    assert json.loads(path.read_text())["metrics"]["success_rate"] == 1.0
    err = io.StringIO()
    assert main([*argv, "--task-option", "planet=3"], out=err) != 0


def test_tool_counts_of_text_protocol_envs_come_from_their_metrics() -> None:
    from types import SimpleNamespace

    from llm_gym.eval.metrics import summarize_episodes

    def episode(calls, errors, metrics):
        return SimpleNamespace(
            reward=0.0,
            metrics=metrics,
            tool_calls=calls,
            tool_errors=errors,
            terminated=True,
            truncated=False,
            num_turns=1,
            error=None,
            completion_tokens=0,
            prompt_tokens=0,
            truncation_cause=None,
        )

    structured = episode(2, 1, {"tool_calls": 9, "tool_errors": 9})  # the loop's count wins
    text_protocol = episode(0, 0, {"tool_calls": 3, "tool_errors": 2})  # e.g. Refund-v0
    no_tools = episode(0, 0, {})
    summary = summarize_episodes([structured, text_protocol, no_tools])
    assert summary["tool_calls_mean"] == pytest.approx(5 / 3)
    assert summary["tool_error_rate"] == pytest.approx(3 / 5)


class BudgetRecorder(Policy):
    """Guesses 50 with three sampled tokens; records each request's ``max_new_tokens``."""

    name = "recorder"

    def __init__(self) -> None:
        self.budgets: list[int | None] = []

    async def act(self, requests):
        self.budgets += [r.max_new_tokens for r in requests]
        return [Generation("50", token_ids=[5, 0, 2]) for _ in requests]


def test_eval_uses_the_env_budget_unless_the_user_sets_one(tmp_path) -> None:
    """No ``max_new_tokens``: every turn asks for GuessNumber's own 16 tokens, and the record
    says so; the user's value wins over it."""
    policy = BudgetRecorder()
    kwargs = dict(episodes=2, max_turns=2, progress=False, print_report=False)
    report = run_and_report("GuessNumber-v0", policy, output=tmp_path / "r.json", **kwargs)
    assert policy.budgets and set(policy.budgets) == {16}
    settings = json.loads((tmp_path / "r.json").read_text())["settings"]
    assert (settings["max_new_tokens"], settings["max_new_tokens_source"]) == (16, "env")
    assert "16 tokens (GuessNumber-v0's own" in report.format_table()
    policy = BudgetRecorder()
    report = run_and_report("GuessNumber-v0", policy, max_new_tokens=5, **kwargs)
    assert set(policy.budgets) == {5}
    assert (report.settings["max_new_tokens"], report.settings["max_new_tokens_source"]) == (
        5,
        "user",
    )
    assert "5 tokens (set by the user)" in report.format_table()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0417, "0.0417"),  # 1 episode in 24 s: never "0.0"
        (0.16, "0.160"),
        (1 / 3, "0.333"),
        (9.996, "10.0"),  # rounds up into one more integer digit
        (52.34, "52.3"),
        (999.6, "1000"),
        (1359.4, "1359"),  # more integer digits than figures: a whole number
        (0.000123, "1.23e-04"),
        (0.0, "0"),
        (math.inf, "inf"),
    ],
)
def test_format_rate_by_hand(value: float, expected: str) -> None:
    assert format_rate(value) == expected


def test_report_prints_rates_in_significant_figures_and_the_budget() -> None:
    """16 episodes of 3 sampled tokens in 384 s: 0.0417 episodes/s and 0.125 tokens/s."""
    report = run_and_report(
        "GuessNumber-v0", BudgetRecorder(), episodes=16, max_turns=1, progress=False,
        print_report=False,
    )  # fmt: skip
    assert report.metrics["completion_tokens_mean"] == 3.0
    assert report.metrics["tokens_per_second"] == pytest.approx(48 / report.wall_time_s)
    report.metrics.update(episodes_per_second=16 / 384, tokens_per_second=48 / 384)
    rows = dict(line.split("  ", 1) for line in report.format_table().splitlines())
    assert rows["episodes per second"].strip() == "0.0417"
    assert rows["sampled tokens per second"].strip() == "0.125"
    assert rows["tokens per episode"].strip().startswith("3.0 sampled")
    assert rows["per-turn token budget"].strip().startswith("16 tokens")


def test_cli_eval_records_the_budget_it_used(tmp_path) -> None:
    import io

    from llm_gym.cli import main

    path = tmp_path / "r.json"
    argv = ["eval", "ToolUseGame-v0", "--episodes", "2", "--no-progress", "--output", str(path)]
    out = io.StringIO()
    assert main(argv, out=out) == 0
    settings = json.loads(path.read_text())["settings"]
    assert (settings["max_new_tokens"], settings["max_new_tokens_source"]) == (64, "env")
    assert "64 tokens (ToolUseGame-v0's own; --max-new-tokens sets another)" in out.getvalue()
    assert main([*argv, "--max-new-tokens", "7"], out=io.StringIO()) == 0
    settings = json.loads(path.read_text())["settings"]
    assert (settings["max_new_tokens"], settings["max_new_tokens_source"]) == (7, "user")


def test_the_report_records_one_token_budget_per_turn_the_one_used(small_model) -> None:
    from llm_gym.policies import HFPolicy

    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, max_new_tokens=5, seed=0)
    common = dict(episodes=1, max_turns=1, progress=False, print_report=False)
    own = run_and_report("GuessNumber-v0", policy, **common).to_dict()  # the env's 16 tokens
    assert own["settings"]["max_new_tokens"] == 16 and "max_new_tokens" not in own["policy"]
    assert own["metrics"]["completion_tokens_mean"] <= 16
    given = run_and_report("GuessNumber-v0", policy, max_new_tokens=2, **common).to_dict()
    assert given["settings"]["max_new_tokens"] == 2 and "max_new_tokens" not in given["policy"]
    assert given["metrics"]["completion_tokens_mean"] <= 2
    assert "max_new_tokens" not in json.dumps(given["policy"])


def test_an_architecture_the_engine_does_not_cover_is_said_once(small_model, monkeypatch) -> None:
    from llm_gym.policies import HFPolicy, hf_engine

    monkeypatch.setattr(hf_engine, "unsupported_reason", lambda model: "model_type 'x'")
    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, max_new_tokens=2, seed=0)
    with pytest.warns(UserWarning, match="batches in waves"):
        report = run_and_report(
            "GuessNumber-v0", policy, episodes=2, max_turns=1, progress=False, print_report=False
        )
    assert "model_type 'x'" in report.policy["batching_note"]
    table = report.format_table()
    assert table.count("batches in waves") == 1 and report.policy["batching"] == "waves"
