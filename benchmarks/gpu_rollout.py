"""The rollout engine against its replay limit on a GPU, and the decode roofline.

Part of :mod:`benchmarks.gpu_check`: on one CUDA device, in bf16, our
``collect_groups`` (``HFPolicy``, continuous batching) and the replay of its own token streams
(:class:`benchmarks.rollout_replay.Replay`: the same forward passes and nothing else) run
interleaved; reported are ours as a share of the replay's tokens/s with a paired bootstrap
interval, and the replay as a share of the HBM roofline for its passes: every pass reads every
weight once and every live row's keys and values once, so ``bytes / bandwidth`` bounds its time
from below. The bandwidth is measured here (a device-to-device copy of 2 GiB: read + write) and
the device's nominal figure is printed beside it when known.

    python -m benchmarks.gpu_check                 # runs this as one of its checks
    python -m benchmarks.gpu_check --dry-run-on-cpu  # the script itself, on CPU, in fp32
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from benchmarks.rollout_replay import Replay, episode_streams
from benchmarks.stats import ratio_interval

NOMINAL_HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}
"""Nominal HBM bandwidth (GB/s) of devices whose name contains the key (vendor data sheets)."""


def copy_bandwidth_gbps(device: str, gib: float = 2.0, repeats: int = 5) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy (median)."""
    n = int(gib * 2**30) // 4
    source = torch.empty(n, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        target.copy_(source)
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return 2 * n * 4 / statistics.median(seconds) / 1e9


def pass_bytes(model: Any, replay: Replay) -> int:
    """Bytes the replay's passes must read at least: all weights once a pass, and each live
    row's keys and values (shared prefix and its own columns) once a pass."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * element
    total = weights * replay.passes
    for stream in replay.streams:
        for op in stream.ops:
            total += per_token * (op.prefix_len + op.column + len(op.ids))
    return total


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_rollout_limit(
    model_dir: str,
    lines: list[str],
    device: str = "cuda",
    *,
    tasks: int = 64,
    episodes_per_task: int = 4,
    repeats: int = 5,
) -> dict[str, Any]:
    """Ours against the replay limit on ``device`` (bf16 on CUDA, fp32 elsewhere); appends a
    markdown section to ``lines`` and returns its numbers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    chosen = list(get_tasks("val"))[:tasks]

    def ours() -> tuple[float, list]:
        policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=64, seed=0)
        _sync(device)
        start = time.perf_counter()
        groups = collect_groups(
            ToolUseGameEnv, chosen, policy, episodes_per_task=episodes_per_task, max_turns=6
        )
        _sync(device)
        return time.perf_counter() - start, [e for g in groups for e in g]

    _, episodes = ours()  # warm-up, and the streams the replay runs
    prefix, streams = episode_streams(episodes)
    replay = Replay(model, prefix, streams, pad)
    replay.run()  # warm-up
    tokens = replay.tokens
    ours_rates, replay_rates = [], []
    for r in range(repeats):  # interleaved, the order alternating
        for name in ("ours", "replay") if r % 2 == 0 else ("replay", "ours"):
            if name == "ours":
                seconds, again = ours()
                ours_rates.append(sum(e.completion_tokens for e in again) / seconds)
            else:
                replay_rates.append(tokens / replay.run())
    ratio = ratio_interval(ours_rates, replay_rates)
    replay_s = tokens / statistics.median(replay_rates)
    measured = copy_bandwidth_gbps(device, gib=2.0 if device.startswith("cuda") else 0.25)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    nominal = next((v for k, v in NOMINAL_HBM_GBPS.items() if k in name), None)
    must_read = pass_bytes(model, replay)
    floor_s = must_read / (measured * 1e9)
    result = {
        "device": name,
        "dtype": str(dtype).removeprefix("torch."),
        "episodes": len(episodes),
        "sampled_tokens": tokens,
        "passes": replay.passes,
        "ours_tokens_per_s": statistics.median(ours_rates),
        "replay_tokens_per_s": statistics.median(replay_rates),
        "ratio_to_replay_limit": ratio.as_json(),
        "copy_bandwidth_gbps": measured,
        "nominal_bandwidth_gbps": nominal,
        "roofline_share_of_replay": floor_s / replay_s,
    }
    lines += [
        f"## Rollout engine vs its replay limit ({result['dtype']}, `{model_dir}`)",
        "",
        f"{len(chosen)} ToolUseGame val tasks x {episodes_per_task} episodes, 64 tokens a turn, "
        f"up to 6 turns; {repeats} interleaved repeats. {tokens} sampled tokens in "
        f"{replay.passes} passes.",
        "",
        f"- ours: {result['ours_tokens_per_s']:.0f} tokens/s; replay: "
        f"{result['replay_tokens_per_s']:.0f} tokens/s; ours / replay: "
        f"**{ratio.format('.0%', suffix='')}** (target >= 80%)",
        f"- decode roofline: the replay's passes must read {must_read / 1e9:.3f} "
        f"GB; at the measured copy bandwidth {measured:.0f} GB/s"
        + (f" (nominal {nominal:.0f})" if nominal else "")
        + f" that takes {floor_s * 1e3:.2f} ms against the replay's {replay_s * 1e3:.1f} ms: "
        f"the replay runs at {result['roofline_share_of_replay']:.1%} of the roofline",
        "",
    ]
    return result
