"""GPU smoke check: the CUDA paths of the rollout engine and the trainers, on one GPU.

Run on a CUDA machine (CI never does; nothing here runs in the default tests)::

    python -m benchmarks.gpu_check --out gpu_check.md

It checks, and writes as a markdown report:

1. ``HFPolicy`` on CUDA: ``collect_groups`` over ToolUseGame val tasks with the tiny model, and
   the recorded logprobs against a teacher-forced CUDA forward pass over the finished samples
   (fp32; the CPU test asks for 1e-4, the GPU's TF32/fused kernels get 1e-3).
2. ``MultiTurnGRPOTrainer`` on CUDA (bf16 where supported): a few optimizer steps through
   ``train_multi_turn`` exactly as the seeds call it (W&B off), seconds per step.
3. The same trainer on a larger randomly initialised Qwen2 (about 76M parameters, the tiny
   model's tokenizer), to exercise bf16 memory and speed beyond toy size.
4. The rollout engine against its replay limit in bf16, with the decode roofline
   (:mod:`benchmarks.gpu_rollout`), on the main job's SFT model (``--model``; the tiny model when
   there is none) and on the larger model; the numbers also go to ``--out`` with ``.json``.
5-7. With ``--smollm2 DIR`` (SmolLM2-135M-Instruct's config and tokenizer, as ``llm-gym
   fetch-model smollm2-135m-instruct`` writes them; its weights are not read): checks 1, 2 and 4
   on a randomly initialised model of its shape, with its real tokenizer and chat template
   (which cannot render tools, so the tools go into the system message as text).

The main job (SFT -> eval -> GRPO -> eval) is run separately with ``train.py`` on the GPU.
On a lent device machine (no network, no model cache), copy the main job's SFT model to
``outputs/tool_use_game_tiny/sft`` first and carry that folder (7 MB) with the run; the
committed results go to ``benchmarks/results/gpu_check.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from benchmarks.common import main_job_model
from benchmarks.gpu_rollout import check_rollout_limit
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.models import build_tiny_model
from llm_gym.policies.hf import HFPolicy
from llm_gym.rollout import collect_groups


def check_policy(
    model_dir: str, lines: list[str], device: str = "cuda", title: str = "1. HFPolicy on CUDA"
) -> None:
    policy = HFPolicy.from_pretrained(
        model_dir, device=device, temperature=1.0, max_new_tokens=48, seed=0
    )
    tasks = list(get_tasks("val"))[:16]
    start = time.perf_counter()
    groups = collect_groups(
        ToolUseGameEnv, tasks, policy, episodes_per_task=4, max_turns=4, max_model_length=1024
    )
    seconds = time.perf_counter() - start
    episodes = [e for g in groups for e in g]
    worst = 0.0
    model = policy.model
    for episode in episodes:
        for sample in episode.samples:
            ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device=device)
            with torch.no_grad():
                logits = model(ids).logits[0].float()
            logps = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            forced = logps[len(sample.prompt_ids) - 1 :].tolist()
            for recorded, teacher, mask in zip(
                sample.logprobs, forced, sample.env_mask, strict=True
            ):
                if mask:
                    worst = max(worst, abs(recorded - teacher))
    turns = sum(e.num_turns for e in episodes) / len(episodes)
    lines += [
        f"## {title}",
        f"- {len(episodes)} episodes in {seconds:.2f} s ({len(episodes) / seconds:.1f} "
        f"episodes/s, first call includes CUDA warm-up), {turns:.2f} turns per episode",
        f"- max |recorded - teacher-forced| logprob over policy tokens: {worst:.2e} "
        f"({'PASS' if worst < 1e-3 else 'FAIL'}, bound 1e-3)",
        "",
    ]


def _shorter_is_better(prompts: list, completions: list, **kwargs: object) -> list[float]:
    """A reward with variance for a model that never succeeds: the shorter reply scores
    higher, so a random model's groups train (the check exercises the backward pass)."""
    return [-min(len(str(c)), 4000) / 4000 for c in completions]


def check_trainer(
    model_dir: str,
    out_dir: Path,
    title: str,
    lines: list[str],
    steps: int = 3,
    reward_funcs: list | None = None,
) -> None:
    from transformers import TrainerCallback

    from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS
    from trainers import GRPOConfig, train_multi_turn

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t)

    config = GRPOConfig(
        model=model_dir,
        batch_size=4,
        episodes_per_task=8,
        num_steps=steps,
        validation_interval=steps,
        max_turns=4,
        max_model_length=1024,
        learning_rate=2e-5,
        wandb_project=None,
        sequential_validation=True,
        max_sampling_attempts=2,
        output_dir=str(out_dir),
        save_strategy="no",
        logging_steps=1,
        report_to="none",
    )
    trainer = train_multi_turn(
        config,
        tasks=list(TOOL_USE_GAME_TASKS)[:64],
        env_factory=ToolUseGameEnv,
        val_tasks=list(get_tasks("val"))[:8],
        callbacks=[Clock()],
        reward_funcs=reward_funcs,
    )
    history = [h for h in trainer.state.log_history if "loss" in h]
    losses = [h["loss"] for h in history]
    finite = all(math.isfinite(x) for x in losses)
    params = sum(p.numel() for p in trainer.model.parameters())
    lines += [
        f"## {title}",
        f"- {params / 1e6:.1f}M parameters, dtype {next(trainer.model.parameters()).dtype}, "
        f"bf16={trainer.args.bf16}, device {trainer.accelerator.device}",
        f"- {len(history)} optimizer steps, losses {[round(x, 4) for x in losses]} "
        f"({'PASS' if finite and len(history) == steps else 'FAIL'}: finite, {steps} steps)",
        f"- seconds per step: {[round(t, 2) for t in times] or 'n/a'}",
        f"- peak CUDA memory: {_peak_gib():.2f} GiB",
        f"- last log: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in history[-1].items()}) if history else 'none'}",  # noqa: E501
        "",
    ]


def _peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def build_larger_model(tiny_dir: str, out_dir: Path, hidden: int = 768, layers: int = 12) -> str:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 64 // 3),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def build_smollm2_shaped(source_dir: str, out_dir: Path, layers: int | None = None) -> str:
    """A randomly initialised model of SmolLM2-135M-Instruct's architecture (``config.json`` of
    ``source_dir``: Llama, 30 layers, grouped-query attention, 49k vocabulary) with its real
    tokenizer and chat template (which cannot render tools: the text layout is exercised). The
    weights are random: speed and memory are the real model's, answers are not."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source_dir)
    config = AutoConfig.from_pretrained(source_dir)
    if layers is not None:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.md")
    parser.add_argument("--work", default="/tmp/llm_gym_gpu_check")
    parser.add_argument("--dry-run-on-cpu", action="store_true", help="check the script itself")
    parser.add_argument(
        "--model", default=None, help="a tools-calling model for check 4 (default: main-job SFT)"
    )
    parser.add_argument(
        "--smollm2",
        default=None,
        help="a folder with SmolLM2-135M-Instruct's config and tokenizer (llm-gym fetch-model "
        "smollm2-135m-instruct; the weights are not read): checks 5-7 on a random model of "
        "its shape",
    )
    args = parser.parse_args()
    device = "cpu" if args.dry_run_on_cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device visible (torch.cuda.is_available() is False)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "disabled")
    lines = [
        "# GPU check",
        "",
        f"{torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}, "
        f"torch {torch.__version__}, "
        f"Python {platform.python_version()}",
        "",
    ]
    results: dict[str, object] = {}
    large = work / "qwen2_100m"

    def rollout(name: str, model_dir: str, **sizes: int) -> None:
        results[name] = check_rollout_limit(model_dir, lines, device, **sizes)

    small = {"tasks": 4, "episodes_per_task": 2, "repeats": 2} if device == "cpu" else {}
    steps = [
        ("policy", lambda: check_policy(tiny, lines, device)),
        (
            "trainer",
            lambda: check_trainer(
                tiny, work / "grpo_tiny", "2. MultiTurnGRPOTrainer on CUDA, tiny model", lines
            ),
        ),
        (
            "larger",
            lambda: check_trainer(
                build_larger_model(tiny, large, *((128, 2) if device == "cpu" else ())),
                work / "grpo_large",
                "3. MultiTurnGRPOTrainer on CUDA, 76M Qwen2",
                lines,
                steps=2,
            ),
        ),
        ("rollout", lambda: rollout("rollout_sft", sft, **small)),
        ("rollout_large", lambda: rollout("rollout_large", str(large), **small)),
    ]
    if args.smollm2:
        smol = work / "smollm2_shaped"

        def smol_dir() -> str:
            if not (smol / "config.json").exists():
                build_smollm2_shaped(args.smollm2, smol, 2 if device == "cpu" else None)
            return str(smol)

        steps += [
            (
                "smollm2_policy",
                lambda: check_policy(
                    smol_dir(), lines, device, "5. HFPolicy on CUDA, SmolLM2-135M's shape"
                ),
            ),
            (
                "smollm2_trainer",
                lambda: check_trainer(
                    smol_dir(),
                    work / "grpo_smollm2",
                    "6. MultiTurnGRPOTrainer on CUDA, SmolLM2-135M's shape (random weights; "
                    "a shorter-reply reward gives its groups variance)",
                    lines,
                    steps=2,
                    reward_funcs=[_shorter_is_better],
                ),
            ),
            ("rollout_smollm2", lambda: rollout("rollout_smollm2", smol_dir(), **small)),
        ]
    tiny = str(build_tiny_model())
    sft = args.model or main_job_model() or tiny
    for name, run in steps:
        start = time.perf_counter()
        try:
            run()
        except Exception as exc:  # report every check, then fail
            import traceback

            lines += [f"## {name}: FAIL", "```", traceback.format_exc()[-3000:], "```", ""]
            print(f"[gpu_check] {name} failed: {exc!r}", flush=True)
        print(f"[gpu_check] {name} done in {time.perf_counter() - start:.1f}s", flush=True)
        Path(args.out).write_text("\n".join(lines))
        Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
