"""The pipeline's held-out evaluation: run a model, compare two runs paired by task, plot a run.

:func:`evaluate_model` scores a saved model with ``run_and_report``; :func:`paired_gain` compares
the reports before and after GRPO task by task (:func:`task_success`); :func:`plot_reward_curve`
draws ``reward_curve.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from trainers.pipeline.config import EvalSettings

__all__ = ["evaluate_model", "paired_gain", "plot_reward_curve", "task_reward", "task_success"]


def evaluate_model(
    model_path: str,
    entry: Any,
    settings: EvalSettings,
    *,
    seed: int,
    output_dir: str | Path,
    max_turns: int,
    label: str,
    temperature: float = 0.0,
    top_p: float = 1.0,
    samples: int = 1,
    tasks: Any = None,
    chat_template: str | None = None,
) -> Any:
    """``run_and_report`` of the model at ``model_path`` on ``settings.split`` of ``entry``.

    ``settings.episodes`` tasks, ``samples`` episodes each (``k=samples``), at ``temperature``
    (0: greedy); the report is written to ``output_dir/eval_<label>.json`` and its first
    episodes (as many as the run report shows) to ``output_dir/episodes_<label>.jsonl``.
    ``tasks``: read from these instead of the registered split (a variant's tasks).
    """
    from llm_gym.eval import run_and_report
    from llm_gym.eval.episode_records import write_episodes
    from llm_gym.eval.run_report import MAX_REPORT_EPISODES
    from llm_gym.policies import policy_from_spec

    policy = policy_from_spec(
        f"hf:{model_path}",
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=seed,
        chat_template=chat_template,
    )
    policy.name = label
    report = run_and_report(
        entry,
        policy,
        split=settings.split,
        tasks=tasks,
        episodes=settings.episodes * samples,
        k=samples,
        seed=seed,
        max_turns=max_turns,
        print_report=False,
        output=Path(output_dir) / f"eval_{label}.json",
    )
    tokenizer = getattr(policy, "tokenizer", None)
    write_episodes(
        Path(output_dir) / f"episodes_{label}.jsonl",
        report.episodes,
        decode=None if tokenizer is None else tokenizer.decode,
        limit=MAX_REPORT_EPISODES,
    )
    return report


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


def task_reward(episodes: Any) -> dict[str, float]:
    """Each task's mean episode reward over its episodes (keys as :func:`task_success`'s).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> def episode(prompt, reward):
        ...     return NS(task=NS(id=None, prompt=prompt), reward=reward)
        >>> task_reward([episode("a", 0.25), episode("a", 0.75), episode("b", 1.0)])
        {'a': 0.5, 'b': 1.0}
    """
    rewards: dict[str, list[float]] = {}
    for episode in episodes:
        rewards.setdefault(_task_key(episode), []).append(float(episode.reward))
    return {key: sum(values) / len(values) for key, values in rewards.items()}


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


def plot_reward_curve(trainer: Any, evaluation: dict[str, Any] | None, path: Path) -> None:
    """The GRPO run's train reward and success, validation success, and the held-out success
    before and after GRPO (``evaluation``: the summary's ``evaluation``), as a PNG at ``path``."""
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
        if mode not in colors:
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
