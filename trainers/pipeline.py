"""The whole recipe behind ``train.py``: model, optional SFT warm start, GRPO, evaluations.

A YAML config has four sections (each optional but ``grpo``)::

    env: ToolUseGame-v0          # a registered llm_gym environment
    model: tiny                  # "tiny" builds the embedded model; or a path / hub id
    output_dir: outputs/run
    seed: 0
    sft: {...}                   # SFTSettings: warm start on oracle transcripts
    grpo: {...}                  # MultiTurnGRPOConfig fields
    evaluation: {...}            # EvalSettings: held-out episodes before and after GRPO

The run writes ``summary.json`` (every number it printed) and ``reward_curve.png`` into
``output_dir``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EvalSettings",
    "PipelineConfig",
    "SFTSettings",
    "load_config",
    "paired_gain",
    "run_pipeline",
    "task_success",
]


@dataclass
class SFTSettings:
    """Multi-turn SFT warm start on the environment's oracle transcripts."""

    episodes: int = 4000
    """Oracle transcripts to train on (train split tasks, then fresh seeded tasks if needed)."""
    learning_rate: float = 2e-3
    """AdamW learning rate (both phases)."""
    batch_size: int = 32
    """Transcripts per optimizer step."""
    epochs: float = 1.0
    """Passes over the transcripts (of the full-transcript phase, when max_steps is None)."""
    max_steps: int | None = None
    """Steps of the full-transcript phase (None: by epochs)."""
    short_context_steps: int = 0
    """Steps of a first phase on the transcripts without system prompt and tool specs
    (:func:`trainers.sft.short_context_dataset`): a small model learns to copy names and
    numbers there much sooner; 0: no such phase."""
    lr_scheduler_type: str = "cosine"
    """The decay of the full-transcript phase: cosine, linear or constant (the short-context
    phase runs at a constant rate after its warmup)."""
    warmup_steps: int = 10
    """Linear warmup steps at the start of the first phase."""
    time_budget_s: float | None = None
    """Stop after this many seconds of training, both phases together (None: no limit); the
    short-context phase gets at most half of it."""


@dataclass
class EvalSettings:
    """Held-out evaluation before and after GRPO: greedy, and sampled as GRPO samples."""

    episodes: int = 200
    """Tasks of the split, one greedy episode each."""
    samples: int = 0
    """Sampled episodes per task at GRPO's temperature (0: greedy only). Success is then the
    mean over each task's samples (pass@1 estimated from ``samples`` draws, the policy GRPO
    optimises), and the paired gain's interval treats each task as one unit."""
    split: str = "val"
    """The split to evaluate on."""
    max_new_tokens: int = 96
    """Tokens per assistant turn."""
    max_turns: int | None = None
    """Turn limit (None: the GRPO config's val_max_turns or max_turns)."""

    def __post_init__(self) -> None:
        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise InvalidArgumentError(
                f"evaluation.episodes must be an integer >= 1, actual value: {self.episodes!r}."
            )
        if not isinstance(self.samples, int) or self.samples < 0:
            raise InvalidArgumentError(
                "evaluation.samples must be an integer >= 0 (0: greedy only), actual value: "
                f"{self.samples!r}."
            )


@dataclass
class PipelineConfig:
    """A ``train.py`` config file."""

    env: str = "ToolUseGame-v0"
    """A registered environment id."""
    model: str = "tiny"
    """``tiny`` (build the embedded model) or a local path / hub id."""
    output_dir: str = "outputs/run"
    """Where models, checkpoints, the summary and the reward curve go."""
    seed: int = 0
    """Seed of everything seeded."""
    val_tasks: int = 64
    """Validation tasks used during GRPO (``validation_interval``)."""
    tiny_model: dict[str, Any] = field(default_factory=dict)
    """Arguments of ``build_tiny_model`` when ``model: tiny``."""
    sft: SFTSettings | None = None
    """The SFT warm start (None: start GRPO from the model as it is)."""
    grpo: dict[str, Any] = field(default_factory=dict)
    """Fields of :class:`trainers.MultiTurnGRPOConfig` (``output_dir`` and ``model`` are set)."""
    evaluation: EvalSettings | None = field(default_factory=EvalSettings)
    """Held-out evaluation before and after GRPO (None: skip)."""


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidArgumentError(
            f"Unknown key(s) {unknown} in {where}; allowed: {sorted(names)}."
        )
    return cls(**data)


def yaml_load(text: str) -> Any:
    r"""``yaml.safe_load`` that reads exponent floats as YAML 1.2 does.

    PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is the *string* ``"1e-4"``: a learning rate
    written that way would reach the optimizer as text. Quoted scalars stay strings.

    Example:
        >>> yaml_load("lr: 1e-4\nname: '5e2'\nother: 2E3")
        {'lr': 0.0001, 'name': '5e2', 'other': 2000.0}
    """
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


@functools.cache
def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2's exponent floats (``1e-4``, ``2E+3``)."""

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read a YAML config; ``overrides`` (``{"grpo.num_steps": 2}``) replace single keys."""

    path = Path(path)
    if not path.exists():
        raise InvalidArgumentError(f"No such config file: {str(path)!r}.")
    data = yaml_load(path.read_text()) or {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    sft = data.pop("sft", None)
    evaluation = data.pop("evaluation", {})
    config = _build(PipelineConfig, data, str(path))
    config.sft = _build(SFTSettings, sft, f"{path}: sft") if sft is not None else None
    config.evaluation = (
        _build(EvalSettings, evaluation, f"{path}: evaluation") if evaluation is not None else None
    )
    return config


def _evaluate(
    model_path: str,
    entry: Any,
    config: PipelineConfig,
    max_turns: int,
    label: str,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    samples: int = 1,
) -> Any:
    from llm_gym.eval import run_and_report
    from llm_gym.policies import policy_from_spec

    assert config.evaluation is not None
    policy = policy_from_spec(
        f"hf:{model_path}",
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=config.evaluation.max_new_tokens,
        seed=config.seed,
    )
    policy.name = label
    return run_and_report(
        entry,
        policy,
        split=config.evaluation.split,
        episodes=config.evaluation.episodes * samples,
        k=samples,
        seed=config.seed,
        max_turns=max_turns,
        print_report=False,
        output=Path(config.output_dir) / f"eval_{label}.json",
    )


def _task_key(episode: Any) -> str:
    return episode.task.id or episode.task.prompt


def task_success(episodes: Any) -> dict[str, float]:
    """Each task's success rate over its episodes (task id, or prompt when it has none).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> def episode(prompt, reward):
        ...     return NS(task=NS(id=None, prompt=prompt), reward=reward, metrics={})
        >>> task_success([episode("a", 1.0), episode("a", 0.0), episode("b", 1.0)])
        {'a': 0.5, 'b': 1.0}
    """
    from llm_gym.eval import is_success

    outcomes: dict[str, list[float]] = {}
    for episode in episodes:
        outcomes.setdefault(_task_key(episode), []).append(float(is_success(episode)))
    return {key: sum(values) / len(values) for key, values in outcomes.items()}


def paired_gain(before: Any, after: Any) -> dict[str, Any]:
    """Success before and after (``run_and_report`` reports), and the gain paired by task.

    Each task counts once, with its success rate over its episodes, so a run with k samples a
    task gets an interval that treats the task, not the episode, as the unit."""
    from llm_gym.eval import paired_difference_interval

    b, a = task_success(before.episodes), task_success(after.episodes)
    keys = sorted(set(b) & set(a))
    if not keys:
        raise InvalidArgumentError("The two evaluations share no task: nothing to pair.")
    paired = set(keys)
    gain, low, high = paired_difference_interval([b[k] for k in keys], [a[k] for k in keys])
    return {
        "tasks": len(keys),
        "episodes": sum(_task_key(e) in paired for e in after.episodes),
        "success_before": sum(b[k] for k in keys) / len(keys),
        "success_after": sum(a[k] for k in keys) / len(keys),
        "gain": gain,
        "gain_ci": [low, high],
        "gain_significant": low > 0,
    }


def _plot(trainer: Any, evaluation: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, rewards, success = [], [], []
    val_steps, val_success = [], []
    for record in trainer.state.log_history:
        if "reward" in record and "step" in record:
            steps.append(record["step"])
            rewards.append(record["reward"])
            success.append(record.get("episodes/success_rate", float("nan")))
        if "val/success_rate" in record:
            val_steps.append(record["step"])
            val_success.append(record["val/success_rate"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, rewards, label="train reward (mean over the step's episodes)", color="#4C72B0")
    ax.plot(steps, success, label="train success rate", color="#55A868", alpha=0.7)
    if val_steps:
        ax.plot(val_steps, val_success, "o-", label="validation success (greedy)", color="#C44E52")
    colors = {"greedy": "gray", "sampled": "#8172B2"}
    for mode, result in (evaluation or {}).items():
        if not isinstance(result, dict):
            continue
        for value, name, style in (
            (result["success_before"], "after SFT", ":"),
            (result["success_after"], "after GRPO", "--"),
        ):
            label = f"held-out success {name} ({mode}): {value:.3f}"
            ax.axhline(value, linestyle=style, color=colors.get(mode, "black"), label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.15, 1.05)
    ax.set_title("Multi-turn GRPO on ToolUseGame-v0 (tiny model, CPU)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Build or load the model, warm-start it, train it with GRPO, evaluate before and after."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from llm_gym.core.registry import env_entry
    from trainers import GRPOConfig, train_multi_turn

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    entry = env_entry(config.env)  # resolved once: every step below asks this entry
    summary: dict[str, Any] = {"env": config.env, "env_version": entry.version}
    started = time.perf_counter()

    # 1. the model
    if config.model == "tiny":
        from llm_gym.models import build_tiny_model

        print("== 1/5 building the tiny model", flush=True)
        # A tokenizer fitted to the environment it trains on (unless the config says otherwise).
        tiny_args = {"envs": [config.env], **config.tiny_model}
        model_path = str(build_tiny_model(seed=config.seed, **tiny_args))
    else:
        model_path = config.model
    summary["base_model"] = model_path

    # 2. the SFT warm start
    if config.sft is not None:
        from trainers.sft import oracle_sft_dataset

        print(f"== 2/5 SFT warm start on {config.sft.episodes} oracle transcripts", flush=True)
        t = time.perf_counter()
        sft_tasks = _sft_tasks(entry, config.sft.episodes, config.seed)
        dataset = oracle_sft_dataset(entry, sft_tasks)
        model_path = _sft(model_path, out, dataset, config.sft, config.seed)
        summary["sft_seconds"] = time.perf_counter() - t
    summary["start_model"] = model_path

    grpo_fields = dict(config.grpo)
    max_turns = grpo_fields.get("max_turns") or entry.max_turns
    eval_turns = (
        (config.evaluation.max_turns if config.evaluation else None)
        or grpo_fields.get("val_max_turns")
        or max_turns
    )

    # 3. held-out success before GRPO
    temperature = float(grpo_fields.get("temperature", 1.0))
    top_p = float(grpo_fields.get("top_p", 1.0))
    samples = config.evaluation.samples if config.evaluation is not None else 0

    def evaluate(path: str, when: str) -> dict[str, Any]:
        assert config.evaluation is not None
        reports = {"greedy": _evaluate(path, entry, config, eval_turns, f"{when}_grpo")}
        print(reports["greedy"].format_table(), flush=True)
        if samples > 0:
            reports["sampled"] = _evaluate(
                path,
                entry,
                config,
                eval_turns,
                f"{when}_grpo_sampled",
                temperature=temperature,
                top_p=top_p,
                samples=samples,
            )
            print(
                f"   sampled (temperature {temperature:g}, {samples} per task): success "
                f"{reports['sampled'].metrics['success_rate']:.3f}",
                flush=True,
            )
        return reports

    before: dict[str, Any] = {}
    if config.evaluation is not None:
        print(
            f"== 3/5 held-out evaluation before GRPO ({config.evaluation.episodes} "
            f"{config.evaluation.split} tasks: greedy"
            + (f", and {samples} samples each at temperature {temperature:g})" if samples else ")"),
            flush=True,
        )
        before = evaluate(model_path, "before")

    # 4. GRPO
    print("== 4/5 multi-turn GRPO", flush=True)
    grpo_fields.setdefault("max_turns", max_turns)
    grpo_fields.setdefault("seed", config.seed)
    grpo_fields.setdefault("use_cpu", not _has_gpu())
    grpo_config = GRPOConfig(output_dir=str(out / "grpo"), model=model_path, **grpo_fields)
    t = time.perf_counter()
    val_tasks = entry.tasks("val")[: config.val_tasks] if config.val_tasks else None
    trainer = train_multi_turn(
        grpo_config,
        tasks=entry.tasks("train"),
        env_factory=entry.env_factory(),
        val_tasks=val_tasks,
        oracle=entry.oracle(),
    )
    summary["grpo_seconds"] = time.perf_counter() - t
    final_path = out / "final"
    trainer.save_model(str(final_path))
    trainer.processing_class.save_pretrained(str(final_path))
    summary["final_model"] = str(final_path)
    summary["validation_history"] = trainer.validation_history

    # 5. held-out success after GRPO, and the gain on the same tasks
    after: dict[str, Any] = {}
    if config.evaluation is not None:
        print("== 5/5 held-out evaluation after GRPO", flush=True)
        after = evaluate(str(final_path), "after")
        summary["evaluation"] = {
            "split": config.evaluation.split,
            "greedy": paired_gain(before["greedy"], after["greedy"]),
        }
        if samples > 0:
            summary["evaluation"]["sampled"] = {
                "temperature": temperature,
                "samples_per_task": samples,
                **paired_gain(before["sampled"], after["sampled"]),
            }
    summary["total_seconds"] = time.perf_counter() - started
    _plot(trainer, summary.get("evaluation"), out / "reward_curve.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    for mode, result in summary.get("evaluation", {}).items():
        if not isinstance(result, dict):
            continue
        how = (
            "greedy, one episode per task"
            if mode == "greedy"
            else f"{result['samples_per_task']} samples per task at temperature "
            f"{result['temperature']:g}"
        )
        low, high = result["gain_ci"]
        print(
            f"\nHeld-out {summary['evaluation']['split']} success, {result['tasks']} tasks "
            f"({how}):\n"
            f"  after SFT:  {result['success_before']:.3f}\n"
            f"  after GRPO: {result['success_after']:.3f}\n"
            f"  gain:       {result['gain']:+.3f}  95% CI [{low:+.3f}, {high:+.3f}] "
            "(paired by task)"
        )
    print(
        f"Total time: {summary['total_seconds'] / 60:.1f} min. Wrote {out / 'summary.json'} "
        f"and {out / 'reward_curve.png'}."
    )
    return summary


def _sft(model_path: str, out: Path, dataset: Any, sft: SFTSettings, seed: int) -> str:
    """The SFT warm start: the short-context phase (if any), then the full transcripts."""
    from trainers.sft import sft_warm_start, short_context_dataset

    budget = sft.time_budget_s
    common = dict(
        learning_rate=sft.learning_rate, per_device_train_batch_size=sft.batch_size, seed=seed
    )
    warmup = sft.warmup_steps
    if sft.short_context_steps > 0:
        t = time.perf_counter()
        print(f"   phase 1: {sft.short_context_steps} steps without the system prompt", flush=True)
        model_path = str(
            sft_warm_start(
                model_path,
                out / "sft_short_context",
                short_context_dataset(dataset),
                max_steps=sft.short_context_steps,
                lr_scheduler_type="constant",
                warmup_steps=warmup,
                time_budget_s=budget / 2 if budget is not None else None,
                **common,
            )
        )
        warmup = 0
        if budget is not None:
            budget = max(budget - (time.perf_counter() - t), 0.1 * budget)
        print("   phase 2: the full transcripts", flush=True)
    return str(
        sft_warm_start(
            model_path,
            out / "sft",
            dataset,
            num_train_epochs=sft.epochs,
            max_steps=sft.max_steps,
            lr_scheduler_type=sft.lr_scheduler_type,  # type: ignore[arg-type]
            warmup_steps=warmup,
            time_budget_s=budget,
            **common,
        )
    )


def _sft_tasks(entry: Any, episodes: int, seed: int) -> list[Any]:
    """``episodes`` distinct tasks for the SFT warm start, none of them in any split.

    GRPO then trains on the train split, on tasks the warm-started model has never seen: on
    tasks it was fitted to, a success can come from recalling the memorised answer instead of
    reading the tool results, and reinforcing that does not carry over to held-out tasks (we
    measured GRPO on SFT-seen tasks lowering held-out success). The tasks come from the env's
    seeded generator (``generate_tasks(seed, n)`` beside its task source); an env without one
    uses its train split (cycled)."""
    import importlib

    from trainers.sft import disjoint_tasks

    train = entry.tasks("train")
    spec = entry.tasks_spec
    module_name = spec.partition(":")[0] if isinstance(spec, str) else None
    generate = (
        getattr(importlib.import_module(module_name), "generate_tasks", None)
        if module_name
        else None
    )
    if generate is None:
        return [train[i % len(train)] for i in range(episodes)]
    held_out = [*train, *entry.tasks("val"), *entry.tasks("test")]
    return disjoint_tasks(generate, episodes, seed=10_000 + seed, exclude=held_out)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
