"""Every benchmark script runs with tiny arguments (smoke tests; no timing asserted)."""

from __future__ import annotations

from benchmarks import env_step


def test_env_step_smoke(tmp_path) -> None:
    rows = env_step.main(env_step.Args(episodes=5, repeats=1, out_dir=tmp_path, write=True))
    kinds = {(env, kind) for env, kind, _, _ in rows}
    assert ("ToolUseGame-v0", "lookup") in kinds and ("ToolUseGame-v0", "final_answer") in kinds
    assert (tmp_path / "env_step.md").exists() and (tmp_path / "env_step.png").exists()
    assert (tmp_path / "env_step.json").exists()


def test_rollout_throughput_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks import rollout_throughput as rt

    summary = rt.main(
        rt.Args(
            model=str(small_model_dir),
            tasks=2,
            episodes_per_task=2,
            max_turns=2,
            max_tokens_per_turn=8,
            repeats=1,
            out_dir=tmp_path,
        )
    )
    assert set(summary) == {"ours", "limit", "trl"}
    assert all(s["episodes"] == 4 and s["wall_s"] > 0 for s in summary.values())
    assert (tmp_path / "rollout_throughput.md").exists()


def test_train_step_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks import train_step

    result = train_step.main(
        train_step.Args(
            model=str(small_model_dir),
            steps=1,
            batch_size=2,
            episodes_per_task=2,
            max_turns=2,
            max_tokens_per_turn=8,
            val_tasks=2,
            val_samples=2,
            out_dir=tmp_path,
        )
    )
    for name in ("ours", "trl"):
        assert len(result[name]["step_times"]) == 1
        assert len(result[name]["val"]["greedy"].episodes) == 2
        assert result[name]["gain"]["sampled"]["episodes"] == 4  # 2 tasks x 2 samples
        assert result[name]["gain"]["sampled"]["tasks"] == 2
    assert result["ratio"] > 0
    assert (tmp_path / "train_step.md").exists()


def test_grpo_overfit_smoke(small_model_dir, capsys) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks.grpo_overfit import main

    main(["--model", str(small_model_dir), "--tasks", "4", "--steps", "1", "--samples", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("before: sampled") and lines[-1].startswith("after:  sampled")


def test_before_after_smoke(tmp_path) -> None:
    import shutil

    import pytest

    from benchmarks import before_after

    if shutil.which("git") is None or not (before_after.ROOT / ".git").exists():
        pytest.skip("before_after compares two git revisions: it needs git and a checkout")
    rows = before_after.main(
        before_after.Args(
            base="HEAD", rounds=1, envs=["GuessNumber-v0"], episodes=2, out_dir=tmp_path
        )
    )
    assert [row["metric"] for row in rows] == ["env_step/GuessNumber-v0 (µs)"]
    assert rows[0]["before"] > 0 and rows[0]["after"] > 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "before_after.md",
        "before_after.json",
        "before_after.png",
    }


def test_async_speedup_smoke(small_model_dir, tmp_path) -> None:
    """Every contender trains and is evaluated; the summary holds the keys the issue names and
    the files are written."""
    import json

    import pytest

    pytest.importorskip("trl")
    from benchmarks import async_speedup

    args = async_speedup.parse(["--quick", "--model", str(small_model_dir)])
    args.write, args.out_dir, args.steps, args.latencies = True, tmp_path, 4, (0.0, 0.02)
    summary = async_speedup.main(args)
    assert {"speedup_with_latency", "speedup_without_latency"} <= set(summary)
    entries = {(e["contender"], e["latency_s"]) for e in summary["entries"]}
    assert ("lockstep", 0.02) in entries and ("async-PIPELINE-off1", 0.0) in entries
    assert all(e["steps_per_hour"] > 0 for e in summary["entries"])
    assert json.loads((tmp_path / "async.json").read_text())["latency_with_s"] == 0.02
    assert (tmp_path / "async.md").exists() and (tmp_path / "async.png").exists()


def test_distill_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks import distill

    args = distill.parse(["--quick", "--teacher", str(small_model_dir)])
    args.student, args.out_dir, args.write = str(small_model_dir), tmp_path, True
    summary = distill.main(args)
    assert len(summary["reverse_kl_per_step"]) == 2
    assert 0.0 <= summary["student_after"]["success"] <= 1.0
    assert (tmp_path / "distill.md").exists() and (tmp_path / "distill.png").exists()
    assert "## Reading" in (tmp_path / "distill.md").read_text()


def test_serve_load_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("uvicorn")
    from benchmarks import serve_load

    args = serve_load.Args.quick(model=str(small_model_dir), duration_s=2.0, out_dir=tmp_path)
    args.write = True
    summary = serve_load.main(args)
    assert summary["ok"] >= 1 and summary["resets"] == 0 and summary["errors"] == 0
    assert summary["latency"]["p99_s"] >= summary["latency"]["p50_s"] > 0
    for suffix in ("md", "json", "png"):
        assert (tmp_path / f"serve_load.{suffix}").exists()
