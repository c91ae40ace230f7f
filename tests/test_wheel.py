"""The installed wheel: ``llm-gym leaderboard`` runs from a fresh virtualenv outside the checkout.

The wheel ships ``llm_gym`` and ``trainers`` only (no ``benchmarks/``). It is installed into a new
venv with ``--no-deps``; its third-party dependencies come from this venv's site-packages through
a ``.pth`` line (offline), which does not process that folder's own ``.pth`` files, so the
editable ``llm_gym`` of the checkout stays out of sight.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    """Run a command; its stdout, or a failure that shows what it printed."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env() -> dict[str, str]:
    """This process's environment without what would point Python or pip at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    return env


def test_leaderboard_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("building the wheel needs hatchling in this venv (pip install hatchling)")
    env = clean_env()
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, ROOT], ROOT, env)
    (wheel,) = dist.glob("llm_gym-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {"llm_gym", "trainers"} <= tops and "benchmarks" not in tops

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    python = venv / "bin" / "python"
    run([*pip, "--python", python, "install", "--no-deps", "-q", wheel], tmp_path, env)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    tmp_path, env).strip())  # fmt: skip
    (site / "000_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")

    work = tmp_path / "work"
    work.mkdir()
    where = run([python, "-c", "import llm_gym; print(llm_gym.__file__)"], work, env).strip()
    assert Path(where).is_relative_to(venv), where
    probe = "import importlib.util as u; print(u.find_spec('benchmarks'))"
    assert run([python, "-c", probe], work, env).strip() == "None"

    llm_gym = venv / "bin" / "llm-gym"
    assert "--out-dir" in run([llm_gym, "leaderboard", "--help"], work, env)
    argv = ["--envs", "GuessNumber-v0", "--policies", "random,oracle", "--episodes", "4"]
    out = run([llm_gym, "leaderboard", *argv, "--no-progress"], work, env)
    assert "ran 2 run(s)" in out

    folder = work / "leaderboard"  # the default --out-dir, in the current folder
    records = json.loads((folder / "leaderboard.json").read_text())["records"]
    by_policy = {r["policy"]: r for r in records}
    assert sorted(by_policy) == ["oracle", "random"]
    assert by_policy["oracle"]["success_rate"] == 1.0
    assert 0.0 <= by_policy["random"]["success_rate"] <= 1.0
    assert {r["env_id"] for r in records} == {"GuessNumber-v0"}
    assert all(r["tasks"] == 4 and r["episodes"] == 4 for r in records)
    table = (folder / "leaderboard.md").read_text()
    assert "| environment | random | oracle |" in table
    assert "| GuessNumber-v0 |" in table and "1.000 [" in table
