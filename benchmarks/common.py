"""What every benchmark shares: the machine's name and writing results."""

from __future__ import annotations

import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_description() -> str:
    """CPU model, core count and Python version, for the header of a results file."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_markdown(name: str, text: str, out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``text`` to ``out_dir/name.md`` and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.md"
    path.write_text(text)
    return path


def cache_dir() -> Path:
    """Where the main job and the benchmarks cache models (``LLM_GYM_CACHE``)."""
    return Path(os.environ.get("LLM_GYM_CACHE", Path.home() / ".cache/llm_gym"))


def default_model(stage: str = "sft") -> str:
    """A model the main job wrote (``stage``: ``sft``, or ``sft_short_context``, its first SFT
    phase), from ``outputs/`` or the cache; exits with a clear message when there is none."""
    for candidate in (
        Path("outputs/tool_use_game_tiny") / stage,
        cache_dir() / "main-job" / stage,
    ):
        if (candidate / "config.json").exists():
            return str(candidate)
    raise SystemExit(
        f"No {stage} model: run the main job (README, set-up command 1) or pass its path "
        f"(e.g. outputs/tool_use_game_tiny/{stage})."
    )


def mean_interval(values: list[float]) -> tuple[float, tuple[float, float]]:
    """The mean of ``values`` and its 95% normal interval.

    Example:
        >>> mean, (low, high) = mean_interval([0.0, 1.0])
        >>> mean, round(low, 2), round(high, 2)
        (0.5, -0.48, 1.48)
    """
    mean = statistics.fmean(values)
    half = 1.959964 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0
    return mean, (mean - half, mean + half)


def sampled_success(
    model: Any,
    tokenizer: Any,
    *,
    tasks: int,
    samples: int,
    max_turns: int,
    max_model_length: int,
    max_tokens_per_turn: int,
    split: str = "test",
    seed: int = 1234,
    temperature: float = 1.0,
) -> tuple[float, tuple[float, float]]:
    """Held-out success on ToolUseGame: ``samples`` episodes at ``temperature`` (1: sampled, 0:
    greedy) for each of the first ``tasks`` tasks of ``split``; the mean of the per-task rates
    and its 95% interval over tasks."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    policy = HFPolicy(
        model, tokenizer, temperature=temperature, max_new_tokens=max_tokens_per_turn, seed=seed
    )
    groups = collect_groups(
        ToolUseGameEnv,
        list(get_tasks(split))[:tasks],
        policy,
        episodes_per_task=samples,
        max_turns=max_turns,
        max_model_length=max_model_length,
        max_new_tokens=max_tokens_per_turn,
    )
    return mean_interval(
        [statistics.fmean(float(e.reward >= 1.0) for e in group) for group in groups]
    )
