"""Training runs end to end (slow: minutes on two CPU cores). Run with ``pytest -m slow``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import StopAfter, free_port, subprocess_env

pytest.importorskip("trl")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_the_seeds_example_runs_two_steps(small_model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    # --- the seeds' code: model path swapped, a callback that stops after 2 steps, and 8 of
    # the tasks (validation runs before the first step and after the last, over every
    # validation task one at a time: 1,000 would take minutes on CPU) ---
    from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS, ToolUseGameEnv
    from trainers import GRPOConfig, train_multi_turn

    tasks = list(TOOL_USE_GAME_TASKS)[:8]

    config = GRPOConfig(
        model=str(small_model_dir),
        batch_size=4,
        episodes_per_task=8,
        num_steps=200,
        validation_interval=10,
        max_turns=6,
        max_model_length=2048,
        learning_rate=2e-5,
        wandb_project="grpo-tool-use-game",
        sequential_validation=True,
        max_sampling_attempts=2,
    )

    trainer = train_multi_turn(
        config,
        tasks=tasks,
        env_factory=lambda task: ToolUseGameEnv(),
        val_tasks=tasks,
        callbacks=[StopAfter(2)],
    )
    # --------------------------------------------------------------------------------------
    assert trainer.state.global_step == 2
    assert [r["step"] for r in trainer.validation_history] == [0, 2]  # before and after
    logged = [r for r in trainer.state.log_history if "terminated_ratio" in r]
    assert len(logged) >= 1 and "zero_variance_skip_ratio" in logged[0]
    # W&B on, as the cookbook's config asks (offline here; its folder is where this process's
    # first W&B run put it, W&B's settings being per process)
    assert trainer.args.report_to == ["wandb"]
    assert any(type(c).__name__ == "WandbCallback" for c in trainer.callback_handler.callbacks)


DDP_SCRIPT = """
import torch
from accelerate import PartialState
from llm_gym import Env, StepResult, Task
from trainers import GRPOConfig, train_multi_turn


class Parity(Env):
    \"\"\"Ends at once; reward 1 when the reply has an even number of characters.\"\"\"

    async def reset(self, task):
        self._m = [{{"role": "user", "content": task.prompt}}]
        return list(self._m)

    async def step(self, message):
        self._m.append(message)
        reward = float(len(message["content"]) % 2 == 0)
        return StepResult(True, False, list(self._m), reward=reward)

    @property
    def tool_specs(self):
        return []

    @property
    def messages(self):
        return list(self._m)


cfg = GRPOConfig(output_dir={out!r}, model={model!r}, batch_size=2, episodes_per_task=4,
    num_steps=2, max_turns=1, max_model_length=512, max_tokens_per_turn=8, learning_rate=1e-2,
    use_cpu=True, save_strategy="no", logging_steps=1, seed=0, temperature=1.0)
state = PartialState()
tasks = [Task(f"say something {{i}}") for i in range(8)]
from transformers import AutoModelForCausalLM
initial = sum(p.sum().item() for p in AutoModelForCausalLM.from_pretrained({model!r}).parameters())
seen = []
import trainers.grpo.trainer as t
original = t.MultiTurnGRPOTrainer.collect
def spy(self, tasks, **kw):
    seen.extend(task.prompt for task in tasks)
    return original(self, tasks, **kw)
t.MultiTurnGRPOTrainer.collect = spy
trainer = train_multi_turn(cfg, tasks=tasks, env_factory=Parity)
w = sum(p.detach().sum().item() for p in trainer.model.parameters())
# One file per rank: the two ranks share one stdout pipe, where their lines can interleave.
with open({rank_dir!r} + f"/rank{{state.process_index}}.txt", "w") as f:
    f.write(f"RANK {{state.process_index}} OF {{state.num_processes}} CHECKSUM {{w:.6f}} INITIAL "
            f"{{initial:.6f}} STEPS {{trainer.state.global_step}} TASKS {{'|'.join(seen)}}")
"""


def test_two_processes_on_cpu(small_model_dir, tmp_path) -> None:
    script = tmp_path / "ddp.py"
    fields = {"out": f"{tmp_path}/out", "model": str(small_model_dir), "rank_dir": str(tmp_path)}
    script.write_text(DDP_SCRIPT.format(**fields))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
            "--main_process_port",
            str(free_port()),
            str(script),
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(tmp_path),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)]
    assert len(lines) == 2 and all("OF 2" in line and "STEPS 2" in line for line in lines)
    ranks = {line.split()[1]: line.split() for line in lines}
    # Each rank ran its own groups: different tasks, different episodes ...
    assert ranks["0"][-1] != ranks["1"][-1]
    # ... and the gradients were all-reduced: both hold the same, changed weights.
    assert ranks["0"][5] == ranks["1"][5]
    assert ranks["0"][5] != ranks["0"][7]


RESUME_SCRIPT = """
import sys, time
from transformers import TrainerCallback
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from trainers import GRPOConfig, train_multi_turn

class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(float(sys.argv[2]))

cfg = GRPOConfig(output_dir=sys.argv[1], model=sys.argv[3], batch_size=2, episodes_per_task=2,
    num_steps=4, max_turns=2, max_model_length=1024, max_tokens_per_turn=16, learning_rate=1e-2,
    use_cpu=True, save_strategy="steps", save_steps=1, logging_steps=1, seed=0)
trainer = train_multi_turn(cfg, tasks=list(get_tasks("train"))[:8], env_factory=ToolUseGameEnv,
    callbacks=[Slow()], resume_from_checkpoint=sys.argv[4] == "resume" or None)
print(f"DONE {trainer.state.global_step}", flush=True)
"""


def test_sigkill_mid_run_resumes_from_a_complete_checkpoint(small_model_dir, tmp_path) -> None:
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    out_dir = tmp_path / "run"
    env = subprocess_env(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out_dir), "1.0", str(small_model_dir), "fresh"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    # Kill it with SIGKILL once step 2 is done (mid-run: it would save, then go on).
    for line in proc.stdout:
        if line.startswith("STEP 2"):
            time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    checkpoints = sorted(p.name for p in out_dir.glob("checkpoint-*"))
    assert checkpoints and all((out_dir / c / "trainer_state.json").exists() for c in checkpoints)
    assert not list(out_dir.glob("checkpoint-*/**/*.tmp"))
    resumed = subprocess.run(
        [sys.executable, str(script), str(out_dir), "0", str(small_model_dir), "resume"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [
        int(line.split()[1]) for line in resumed.stdout.splitlines() if line.startswith("STEP")
    ]
    last = int(checkpoints[-1].split("-")[1])
    assert steps[0] == last + 1  # continued from the last complete checkpoint's step
    assert "DONE 4" in resumed.stdout


def test_train_py_runs_the_mixture_config_for_two_steps(tmp_path) -> None:
    """configs/mixture_example.yaml through train.py with the tiny model (its tokenizer on all
    five environments), 2 steps, a few evaluation tasks: per-env metrics and the leaderboard."""
    import json

    out = tmp_path / "run"
    sets = [
        f"output_dir={out}", "grpo.num_steps=2", "grpo.episodes_per_task=2",
        "grpo.max_tokens_per_turn=16", "grpo.validation_interval=2", "val_tasks=1",
        "evaluation.episodes=2", "evaluation.max_new_tokens=16",
    ]  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config",
         str(ROOT / "configs" / "mixture_example.yaml"), "--set", *sets],
        capture_output=True, text=True, timeout=1500, env=subprocess_env(tmp_path), cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["envs"]) == {"ToolUseGame-v0", "GuessNumber-v0", "Wordle-v0", "Maze-v0",
                                    "Math-v0"}  # fmt: skip
    steps = [r for r in summary["train_log"] if "env/Math-v0/episodes" in r]
    assert len(steps) == 2 and all(r["env/ToolUseGame-v0/share"] == 0.4 for r in steps)
    records = json.loads((out / "leaderboard.json").read_text())["records"]
    assert {(r["env_id"], r["policy"]) for r in records} == {
        (env, stage) for env in summary["envs"] for stage in ("before-grpo", "after-grpo")
    }
    table = (out / "leaderboard.md").read_text()
    assert "Maze-v0" in table and "after-grpo" in table


def test_train_py_runs_a_shrunk_suite_config_with_its_warm_start(tmp_path) -> None:
    """configs/suite_tiny.yaml through train.py, shrunk (a few SFT steps of each phase, one
    GRPO step, two evaluation tasks): the warm start reads every env's demonstrations by
    weight, and the leaderboard holds each env after SFT and after GRPO."""
    import json

    out = tmp_path / "run"
    sets = [
        f"output_dir={out}", "sft.episodes=16", "sft.batch_size=4", "sft.short_context_steps=2",
        "sft.max_steps=2", "grpo.num_steps=1", "grpo.episodes_per_task=2",
        "grpo.max_tokens_per_turn=16", "evaluation.episodes=2", "evaluation.max_new_tokens=16",
    ]  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--config",
         str(ROOT / "configs" / "suite_tiny.yaml"), "--set", *sets],
        capture_output=True, text=True, timeout=1500, env=subprocess_env(tmp_path), cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    weights = {name: env["weight"] for name, env in summary["envs"].items()}
    assert len(weights) >= 5
    # 16 demonstrations by the weights 3 2 1 1 1 (of 8): 6 4 2 2 2, every oracle succeeds
    assert summary["sft_rows"] == {name: 2 * w for name, w in weights.items()}
    assert (out / "sft_short_context" / "sft_info.json").is_file()
    records = json.loads((out / "leaderboard.json").read_text())["records"]
    assert {(r["env_id"], r["policy"]) for r in records} == {
        (env, stage) for env in weights for stage in ("after-sft", "after-grpo")
    }
    assert "after-sft" in (out / "leaderboard.md").read_text()
