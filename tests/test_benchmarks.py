"""Every benchmark script runs with tiny arguments (smoke tests; no timing asserted)."""

from __future__ import annotations

from benchmarks import env_step


def test_env_step_smoke(tmp_path) -> None:
    rows = env_step.main(env_step.Args(episodes=5, repeats=1, out_dir=tmp_path, write=True))
    kinds = {(env, kind) for env, kind, _, _ in rows}
    assert ("ToolUseGame-v0", "lookup") in kinds and ("ToolUseGame-v0", "final_answer") in kinds
    assert (tmp_path / "env_step.md").exists() and (tmp_path / "env_step.png").exists()
