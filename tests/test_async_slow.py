"""Async training end to end (slow): the seeds' async config through ``train_multi_turn``, two
CPU processes under ``accelerate launch``, and SIGKILL mid-run then resume. Run with
``pytest -m slow``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import StopAfter, free_port, subprocess_env

pytest.importorskip("trl")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
ASYNC_KEYS = (
    "async/train_wait_s",
    "async/dropped_stale_groups",
    "async/dropped_stale_ratio",
    "async/staleness_mean",
    "async/staleness_max",
    "async/generator_idle_s",
    "async/weight_sync_s",
)


def _worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("llm-gym-")]


def _step_records(log_history: list[dict]) -> list[dict]:
    """The per-step training records (those with a loss)."""
    return [r for r in log_history if "loss" in r]


def test_the_seeds_async_config_runs_two_steps(small_model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    # --- the seeds' code: the training example's tasks and env factory, the async config
    # with the model path swapped and one generator replica (a callback stops after 2 steps) ---
    from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS, ToolUseGameEnv
    from trainers.grpo.config import GRPOConfig
    from trainers.grpo.train import train_multi_turn

    tasks = list(TOOL_USE_GAME_TASKS)

    config = GRPOConfig(
        model=str(small_model_dir),
        max_turns=6,
        batch_size=4,
        episodes_per_task=8,
        max_steps_off_policy=1,
        groups_in_flight=8,
        num_generator_replicas=1,
    )

    trainer = train_multi_turn(
        config,
        tasks=tasks,
        env_factory=lambda task: ToolUseGameEnv(),
        val_tasks=tasks,
        callbacks=[StopAfter(2)],
    )
    # ---------------------------------------------------------------------------------------
    assert config.is_async and trainer.state.global_step == 2
    # the seeds' config keeps TRL's logging_steps: one record, the run's means
    logged = [r for r in trainer.state.log_history if "async/train_wait_s" in r]
    assert len(logged) >= 1
    for key in (*ASYNC_KEYS, "zero_variance_skip_ratio"):
        assert key in logged[-1], key
    assert logged[-1]["async/staleness_max"] <= 1
    assert trainer._async is None and not _worker_threads()


TWO_PROCESS_SCRIPT = """
import sys, threading
from accelerate import PartialState
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from trainers import GRPOConfig, train_multi_turn
import trainers.async_rl.collect as collect
import trainers.async_rl.rollout as rollout

workers, taken = [], []
original_init, original_take = collect.AsyncCollector.__init__, rollout.RolloutWorker.take

def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    workers.append(self.worker)

def take(self, n):
    groups, waited = original_take(self, n)
    taken.extend(episodes[0].task.id for _, episodes in groups)
    return groups, waited

collect.AsyncCollector.__init__, rollout.RolloutWorker.take = init, take

out, model = sys.argv[1], sys.argv[2]
cfg = GRPOConfig(output_dir=out, model=model, batch_size=2, episodes_per_task=2, num_steps=3,
    max_turns=2, max_model_length=1024, max_tokens_per_turn=12, learning_rate=1e-2,
    use_cpu=True, save_strategy="steps", save_steps=3, logging_steps=1, seed=0,
    max_steps_off_policy=1, groups_in_flight=4)
state = PartialState()
trainer = train_multi_turn(cfg, tasks=list(get_tasks("train"))[:8], env_factory=ToolUseGameEnv)
w = sum(p.detach().double().sum().item() for p in trainer.model.parameters())
alive = [t.name for t in threading.enumerate() if t.name.startswith("llm-gym-")]
# One file per rank: the two ranks share one stdout pipe, where their lines can interleave.
with open(f"{sys.argv[1]}.rank{state.process_index}", "w") as f:
    f.write(f"RANK {state.process_index} OF {state.num_processes} "
            f"STEPS {trainer.state.global_step} WORKERS {len(workers)} ALIVE {len(alive)} "
            f"CHECKSUM {w:.9f} TASKS {'|'.join(taken)}")
"""


def test_async_training_under_accelerate_with_two_cpu_processes(small_model_dir, tmp_path):
    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    out_dir = tmp_path / "out"
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
            "--main_process_port",
            str(free_port()),
            str(script),
            str(out_dir),
            str(small_model_dir),
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(tmp_path),
        timeout=600,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    lines = [Path(f"{out_dir}.rank{rank}").read_text().split() for rank in range(2)]
    ranks = {line[1]: dict(zip(line[2::2], line[3::2], strict=False)) for line in lines}
    assert sorted(ranks) == ["0", "1"]
    for rank in ranks.values():
        # each process ran its own rollout worker, stopped when training ended
        assert rank["OF"] == "2" and rank["STEPS"] == "3"
        assert rank["WORKERS"] == "1" and rank["ALIVE"] == "0"
        assert len(rank["TASKS"].split("|")) >= 3  # one group per step each, at least
    # the workers' task orders are seeded per process; the gradients were all-reduced
    assert ranks["0"]["TASKS"] != ranks["1"]["TASKS"]
    assert ranks["0"]["CHECKSUM"] == ranks["1"]["CHECKSUM"]
    state = json.loads((out_dir / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    records = _step_records(state["log_history"])
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        for key in ASYNC_KEYS:
            assert key in record, key
        assert record["async/staleness_max"] <= 1


RESUME_SCRIPT = """
import json, os, sys, time
from safetensors.torch import load_file
from transformers import TrainerCallback
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from trainers import GRPOConfig, train_multi_turn
import trainers.async_rl.collect as collect
import trainers.async_rl.rollout as rollout

out, pause, model, how = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
original_init, original_take = collect.AsyncCollector.__init__, rollout.RolloutWorker.take

def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    diff = 0.0
    if self.version > 0:  # the generator's weights against the checkpoint's
        saved = load_file(os.path.join(out, f"checkpoint-{self.version}", "model.safetensors"))
        mine = self.replicas[0].model.state_dict()
        common = [k for k in saved if k in mine]
        assert common
        diff = max((saved[k].float() - mine[k].float()).abs().max().item() for k in common)
    print(f"COLLECTOR {self.version} {diff}", flush=True)

def take(self, n):
    groups, waited = original_take(self, n)
    print("TAKEN " + " ".join(str(version) for version, _ in groups), flush=True)
    return groups, waited

collect.AsyncCollector.__init__, rollout.RolloutWorker.take = init, take

class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(pause)

cfg = GRPOConfig(output_dir=out, model=model, batch_size=2, episodes_per_task=2,
    num_steps=4, max_turns=2, max_model_length=1024, max_tokens_per_turn=12, learning_rate=1e-2,
    use_cpu=True, save_strategy="steps", save_steps=1, logging_steps=1, seed=0,
    max_steps_off_policy=1, groups_in_flight=4)
trainer = train_multi_turn(cfg, tasks=list(get_tasks("train"))[:8], env_factory=ToolUseGameEnv,
    callbacks=[Slow()], resume_from_checkpoint=how == "resume" or None)
print("LOG " + json.dumps(trainer.state.log_history), flush=True)
print(f"DONE {trainer.state.global_step}", flush=True)
"""


def test_async_run_killed_mid_run_resumes_with_fresh_groups(small_model_dir, tmp_path) -> None:
    """SIGKILL while groups are in flight, then resume: the groups in flight die with the
    process; the resumed worker starts from the checkpoint's weights and version, so the
    first step after the checkpoint trains only on groups it started (staleness 0)."""
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    out_dir = tmp_path / "run"
    env = subprocess_env(tmp_path)
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out_dir), "1.0", str(small_model_dir), "fresh"],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    deadline = time.time() + 300
    while not (out_dir / "checkpoint-2").exists():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.time() < deadline, "no checkpoint-2 within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # the worker always holds groups in flight
    assert proc.wait(timeout=60) == -signal.SIGKILL
    log.close()
    killed = (tmp_path / "killed.log").read_text()
    assert "DONE" not in killed and "TAKEN" in killed
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*"))
    last = checkpoints[-1]
    assert 2 <= last < 4 and (out_dir / f"checkpoint-{last}" / "trainer_state.json").exists()

    resumed = subprocess.run(
        [sys.executable, str(script), str(out_dir), "0", str(small_model_dir), "resume"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = resumed.stdout.splitlines()
    assert "DONE 4" in lines
    steps = [int(line.split()[1]) for line in lines if line.startswith("STEP")]
    assert steps == list(range(last + 1, 5))
    # one worker, started at the checkpoint's version with exactly the checkpoint's weights
    collectors = [line.split() for line in lines if line.startswith("COLLECTOR")]
    assert len(collectors) == 1 and int(collectors[0][1]) == last
    assert float(collectors[0][2]) == 0.0
    # no group older than the checkpoint was taken: the killed run's groups are gone
    starts = [int(v) for line in lines if line.startswith("TAKEN") for v in line.split()[1:]]
    assert starts and min(starts) >= last
    history = json.loads(next(line[4:] for line in lines if line.startswith("LOG ")))
    records = _step_records(history)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    first = next(r for r in records if r["step"] == last + 1)
    assert first["async/staleness_max"] == 0 and first["async/dropped_stale_groups"] == 0
    assert all(r["async/staleness_max"] <= 1 for r in records)
