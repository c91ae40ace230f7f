"""Token counts an endpoint reports (llm_gym.rollout.records.usage_count). Unbounded, a server
reporting usage of 10**400 tokens makes the report's means raise OverflowError once every
episode has run, and the report is lost. Counts past MAX_TOKEN_COUNT are clamped (with a
warning); counts that are not numbers count 0; the report is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_gym.rollout.records import MAX_TOKEN_COUNT, usage_count
from tests.test_openai_policy import FakeEndpoint, completion


def test_usage_counts_are_clamped_or_zero() -> None:
    with pytest.warns(RuntimeWarning, match="MAX_TOKEN_COUNT"):
        assert usage_count(10**400) == MAX_TOKEN_COUNT
    with pytest.warns(RuntimeWarning):
        assert usage_count(float("inf")) == MAX_TOKEN_COUNT
    assert [usage_count(v) for v in (5, 5.9, MAX_TOKEN_COUNT, -1, float("nan"), "9", None)] == [
        5,
        5,
        MAX_TOKEN_COUNT,
        0,
        0,
        0,
        0,
    ]


def test_a_server_reporting_10_to_the_400_tokens_loses_no_report(tmp_path: Path, capsys) -> None:
    from llm_gym.cli import main

    server = FakeEndpoint()
    body = completion("I guess 50")
    body["usage"] = {"prompt_tokens": 10**400, "completion_tokens": 10**400, "total_tokens": 1}
    server.script = [("ok", body)] * 8
    output = tmp_path / "report.json"
    argv = ["eval", "GuessNumber-v0", "--policy", f"openai:m@{server.url}", "--episodes", "2"]
    try:
        with pytest.warns(RuntimeWarning, match="past 9,007,199,254,740,992"):
            code = main([*argv, "--max-turns", "2", "--output", str(output), "--no-progress"])
    finally:
        server.close()
    assert code == 0, capsys.readouterr().err  # OverflowError after both episodes without it
    metrics = json.loads(output.read_text())["metrics"]
    assert metrics["turns_mean"] == 2  # two turns, each reported past the limit...
    assert metrics["completion_tokens_mean"] == MAX_TOKEN_COUNT  # ...and the sum clamped too
    assert metrics["prompt_tokens_mean"] == MAX_TOKEN_COUNT
