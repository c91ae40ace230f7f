"""Chaos test of collection (:mod:`llm_gym.rollout`): environments that raise, hang past
``env_timeout_s`` or write invalid text, and a policy endpoint that drops connections
(``benchmarks/chaos.py`` has the scenario; ``python -m benchmarks.chaos`` runs it larger and writes
results/chaos.md).

Every episode that no fault touched completes, every faulted one ends with its own cause,
nothing hangs (the run is bounded), and the counts are printed and checked.
"""

from __future__ import annotations

import json

from benchmarks import chaos


def test_chaos_every_unaffected_episode_completes(tmp_path) -> None:
    args = chaos.Args(
        tasks_per_mode=3, episodes_per_task=2, wall_bound_s=30.0, out_dir=tmp_path, write=True,
        repeats=2,
    )  # fmt: skip
    result = chaos.main(args)  # prints the counts; raises TimeoutError if anything hangs

    assert result.table == result.expected, result.table
    assert result.endpoint["reset"] > 6  # random drops happened beyond the down episodes
    assert result.wall_s < args.wall_bound_s
    assert (tmp_path / "chaos.md").exists()
    saved = json.loads((tmp_path / "chaos.json").read_text())
    assert saved["all_as_expected"] and len(saved["runs"]) == 2 and "conditions" in saved
    assert set(saved["wall_s"]) >= {"median", "ci"}
    for records in result.episodes.values():  # whatever happened, the records are valid text
        for episode in records:
            json.dumps([episode.messages, episode.error], ensure_ascii=False).encode("utf-8")

    def first(task_id: str):
        return result.episodes[task_id][0]

    def tool_text(task_id: str) -> str:
        return "\n".join(m["content"] for m in first(task_id).messages if m["role"] == "tool")

    assert "tool_error: cannot read b'\\xff' as text: \ufffd" in tool_text("tool_raises-0")
    assert "result \ufffd with a NUL \x00 inside" in tool_text("surrogates-0")
    assert first("huge-0").messages[3]["content"].startswith("\ufffdxxx")  # after the tool reply
    assert "did not return within env_timeout_s" in first("step_hangs-0").error
    assert "disk full \ufffd" in first("step_raises-0").error
    assert first("step_raises-0").num_turns == 2
    assert "the database is gone \ufffd" in first("reset_raises-0").error
    assert "failed after 3 attempts" in first("policy_down-0").error
