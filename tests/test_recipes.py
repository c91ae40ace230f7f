"""The cookbook's recipe files (``recipes/``) run as scripts, each with tiny arguments (slow).

Each runs in a subprocess as a user runs it (``python recipes/...``), on the small test model
(``--model`` / ``--policy``), with W&B offline, and must finish with exit status 0 having done
its work: a GRPO step logged with the seeds' metric names, an evaluation report printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

pytest.importorskip("trl")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def run_recipe(path: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / path), *args],
        cwd=tmp_path,
        env=subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "recipe", ["recipes/grpo/tool_use_game.py", "recipes/grpo/tool_use_game_async.py"]
)
def test_grpo_recipe_trains(recipe, small_model_dir, tmp_path) -> None:
    done = run_recipe(
        recipe, ["--model", str(small_model_dir), "--num-steps", "1", "--tasks", "4"], tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = done.stdout + done.stderr  # the step log, as the console shows it
    assert "'terminated_ratio'" in logged and "'zero_variance_skip_ratio'" in logged
    assert list(tmp_path.rglob("checkpoint-1"))  # the one step ran to its checkpoint
    assert (tmp_path / "wandb").exists()  # W&B on, as in the cookbook (offline here)


def test_serverless_eval_recipe_reports(small_model_dir, tmp_path) -> None:
    done = run_recipe(
        "recipes/serverless_eval/tool_use_game.py",
        ["--policy", f"hf:{small_model_dir}", "--episodes", "4"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "success" in done.stdout.lower()
