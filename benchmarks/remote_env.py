"""Environments out of process: ``llm-gym serve-env`` under load, and collection through
:class:`~llm_gym.integrations.openenv.client.RemoteEnv` against collection in process.

The server runs as its own process (``python -m llm_gym.cli serve-env ToolUseGame-v0 --port 0``,
openenv-core's server on uvicorn), on loopback. Two measurements:

1. **Load.** ``sessions`` players, all at once, each playing ``rounds`` ToolUseGame episodes one
   after another with the scripted oracle; every episode is one OpenEnv session (a WebSocket:
   ``reset``, the steps, ``close``), so ``sessions`` sessions are open together all through.
   Reported: steps per second (reset and step calls), p50/p99/max latency of a call from the
   client's side, episodes that failed (a lost session: must be 0), the sessions the server
   still holds at the end (must be 0), and the server's resident memory (RSS) after each round
   (flat: the last round within a few MiB of the first).
2. **Collection.** ``collect_groups`` with the tiny model (``HFPolicy``, continuous batching) on
   the same ToolUseGame tasks, seeds and budgets, with the env in process (``in_process``) and
   through ``RemoteEnv`` (``remote``), interleaved for ``--repeats`` repeats by the common
   harness (:mod:`benchmarks.common`); episodes per second as medians with 95% intervals, and
   the ratio remote / in-process with its paired-bootstrap interval (target: at least 0.8: the
   model, not the network, should be the bottleneck). The server shares the two cores with the
   model, so both contenders run at each of ``--collection-threads`` torch thread counts
   (default 1 and 2, all interleaved): with 1 the server has a core to itself, with 2 it
   competes for the model's cores. Each count gets its own ratio; the headline is the lower.

    python -m benchmarks.remote_env              # writes results/remote_env.{md,json,png}
    python -m benchmarks.remote_env --quick      # a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    Conditions,
    add_harness_arguments,
    check_repeats,
    default_model,
    interleave,
    output_dir,
    pin_threads,
    write_json,
    write_markdown,
)
from benchmarks.procstat import cpu_seconds, rss_mib
from benchmarks.stats import median_interval, ratio_interval

ENV_ID = "ToolUseGame-v0"


def start_server(max_sessions: int, timeout_s: float = 120.0) -> tuple[subprocess.Popen[str], str]:
    """``llm-gym serve-env`` in a child process; returns it and its URL (killed, and an exit
    with the reason, when it has not announced its URL within ``timeout_s``)."""
    command = [sys.executable, "-m", "llm_gym.cli", "serve-env", ENV_ID, "--port", "0"]
    command += ["--max-sessions", str(max_sessions)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    found: list[str] = []

    def read() -> None:  # a thread: a silent server cannot block the deadline below
        for line in process.stdout:  # type: ignore[union-attr]
            match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
            if match and not found:
                found.append(match.group(1))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not found and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not found:
        stop_server(process)
        raise SystemExit(f"the env server did not start within {timeout_s:g} s: {command}")
    return process, found[0]


def stop_server(process: subprocess.Popen[str]) -> None:
    """Terminate the server; kill it when it does not exit within 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


# --- 1. load ------------------------------------------------------------------------------------


async def _play(
    url: str, tasks: list[Any], timings: dict[str, list[float]], failures: list[str]
) -> None:
    """One oracle episode of each task in turn, one session each, every call timed (``reset``
    opens the session: the WebSocket handshake and the server's new env are in its time)."""
    from llm_gym.envs.tool_use_game import oracle_action
    from llm_gym.integrations.openenv import RemoteEnv

    for task in tasks:
        env = RemoteEnv(url, call_timeout_s=60.0)
        try:
            start = time.perf_counter()
            messages = await env.reset(task)
            timings["reset"].append(time.perf_counter() - start)
            while True:
                action = oracle_action(task, messages)
                start = time.perf_counter()
                result = await env.step(action)
                timings["step"].append(time.perf_counter() - start)
                messages = result.messages
                if result.terminated or result.truncated:
                    if result.reward != 1.0:
                        failures.append(f"{task.id}: reward {result.reward}")
                    break
        except Exception as exc:  # a lost session: counted, never hidden
            failures.append(f"{task.id}: {type(exc).__name__}: {exc}"[:300])
        finally:
            await env.close()


def run_load(url: str, pid: int, sessions: int, rounds: int) -> dict[str, Any]:
    """``sessions`` players at once for ``rounds`` rounds (see the module docstring)."""
    from llm_gym.envs.tool_use_game import get_tasks

    tasks = list(get_tasks("val"))
    timings: dict[str, list[float]] = {"reset": [], "step": []}
    failures: list[str] = []
    rss = [rss_mib(pid)]
    per_round = []

    async def one_round(r: int) -> None:
        chosen = [[tasks[(r * sessions + i) % len(tasks)]] for i in range(sessions)]
        await asyncio.gather(*(_play(url, t, timings, failures) for t in chosen))

    def calls() -> int:
        return len(timings["reset"]) + len(timings["step"])

    server_cpu, client_cpu = cpu_seconds(pid), time.process_time()
    start = time.perf_counter()
    for r in range(rounds):
        began, before = time.perf_counter(), calls()
        asyncio.run(one_round(r))
        per_round.append({"calls": calls() - before, "wall_s": time.perf_counter() - began})
        rss.append(rss_mib(pid))
    wall = time.perf_counter() - start
    server_cpu, client_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - client_cpu
    time.sleep(0.5)
    left = httpx.get(f"{url}/llm_gym/sessions", timeout=10).json()

    def percentiles(values: list[float]) -> dict[str, float]:
        ordered = sorted(values) or [float("nan")]
        at = {q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9, 0.99)}
        return {"p50": at[0.5], "p90": at[0.9], "p99": at[0.99], "max": ordered[-1]}

    return {
        "sessions": sessions,
        "rounds": rounds,
        "episodes": sessions * rounds,
        "calls": calls(),
        "wall_s": wall,
        "calls_per_s": calls() / wall,
        "steps_per_s": len(timings["step"]) / wall,
        "server_cpu_share": server_cpu / wall,
        "client_cpu_share": client_cpu / wall,
        "latency_s": percentiles(timings["reset"] + timings["step"]),
        "reset_latency_s": percentiles(timings["reset"]),
        "step_latency_s": percentiles(timings["step"]),
        "failed_episodes": len(failures),
        "failures": failures[:10],
        "sessions_left_on_server": left["active"],
        "rss_mib_after_round": rss,
        "per_round": per_round,
        "latencies_s": timings["reset"] + timings["step"],
        "step_latencies_s": timings["step"],
    }


# --- 2. collection ------------------------------------------------------------------------------


def collection_runner(
    name: str, url: str, model: Any, tokenizer: Any, args: argparse.Namespace, threads: int
):
    """``run(repeat)`` for one contender: ``collect_groups`` over the same tasks and seed, with
    torch's intra-op threads set to ``threads`` first."""
    import torch

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.integrations.openenv import RemoteEnvFactory
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    tasks = list(get_tasks("val"))[: args.tasks]
    factory = ToolUseGameEnv if name == "in_process" else RemoteEnvFactory(url)

    def run(repeat: int) -> dict[str, Any]:
        torch.set_num_threads(threads)
        policy = HFPolicy(model, tokenizer, max_new_tokens=64, seed=1000 + max(repeat, 0))
        start = time.perf_counter()
        groups = collect_groups(
            factory,
            tasks,
            policy,
            episodes_per_task=args.group_size,
            max_turns=6,
            max_model_length=1024,
            max_new_tokens=64,
        )
        wall = time.perf_counter() - start
        episodes = [e for g in groups for e in g]
        return {
            "wall_s": wall,
            "episodes": len(episodes),
            "turns": sum(e.num_turns for e in episodes),
            "env_errors": sum(e.truncation_cause == "env" for e in episodes),
            "success": statistics.fmean(float(e.reward >= 1.0) for e in episodes),
        }

    return run


def run_collection(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    contenders = {
        f"{name}@{threads}": collection_runner(name, url, model, tokenizer, args, threads)
        for threads in args.collection_threads
        for name in ("in_process", "remote")
    }
    result = interleave(
        contenders,
        args.repeats,
        order=args.order,
        seed=args.seed,
        warmup=list(contenders),
        log=lambda line: print(f"[remote_env] {line}", file=sys.stderr, flush=True),
    )
    rates = {name: result.rates(name, "episodes") for name in contenders}
    by_threads = {
        str(t): ratio_interval(rates[f"remote@{t}"], rates[f"in_process@{t}"], seed=args.seed)
        for t in args.collection_threads
    }
    worst = min(by_threads.values(), key=lambda ratio: ratio.median)
    return {
        "episodes_per_s": {name: median_interval(v).as_json() for name, v in rates.items()},
        "ratio_by_threads": {t: ratio.as_json() for t, ratio in by_threads.items()},
        "ratio_remote_to_in_process": worst.as_json(),
        "runs": result.runs,
        "order": result.order,
    }


# --- report -------------------------------------------------------------------------------------


def report(summary: dict[str, Any]) -> str:
    load, coll = summary["load"], summary["collection"]
    rss = load["rss_mib_after_round"]
    growth = rss[-1] - rss[2] if len(rss) > 3 else 0.0  # after the first round's warm-up
    eps = coll["episodes_per_s"]
    a = summary["args"]

    def verdict(ratio: dict[str, Any]) -> str:
        if ratio["ci"][0] >= 0.8:
            return "met"
        return "met by the median" if ratio["median"] >= 0.8 else "missed"

    return "\n".join(
        [
            "# Environments out of process (`llm-gym serve-env`, `RemoteEnv`)",
            "",
            Conditions(**summary["conditions"]).describe(),
            "",
            "## 1. Load: one server, many concurrent sessions",
            "",
            f"{load['sessions']} players at once, each playing {load['rounds']} oracle episodes "
            f"of {ENV_ID} in turn, one OpenEnv session (WebSocket) per episode, against one "
            "`llm-gym serve-env` process on loopback (openenv-core's server on uvicorn).",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| episodes | {load['episodes']} |",
            f"| calls (reset + step) | {load['calls']} in {load['wall_s']:.1f} s |",
            f"| calls per second (steps per second) | {load['calls_per_s']:.0f} "
            f"({load['steps_per_s']:.0f}) |",
            *(
                f"| {name} latency p50 / p90 / p99 / max | "
                + " / ".join(f"{1000 * load[key][q]:.1f}" for q in ("p50", "p90", "p99", "max"))
                + " ms |"
                for name, key in (
                    ("step", "step_latency_s"),
                    ("reset (opens the session)", "reset_latency_s"),
                    ("any call", "latency_s"),
                )
            ),
            f"| episodes failed (lost sessions) | **{load['failed_episodes']}** |",
            f"| sessions left on the server | **{load['sessions_left_on_server']}** |",
            f"| server RSS at start / after each round | {rss[0]:.0f} / "
            f"{' / '.join(f'{v:.0f}' for v in rss[1:])} MiB (second to last round "
            f"{growth:+.1f} MiB) |",
            "",
            "Latency is seen from the client: it includes the client's own work in the same "
            "event loop as every other player, and queueing at the server. CPU in use over the "
            f"run: the server {load['server_cpu_share']:.2f} of a core, the client (all "
            f"{load['sessions']} players, one event loop) {load['client_cpu_share']:.2f}; the "
            "two processes share 2 cores.",
            "",
            "## 2. Collection with the tiny model: in process vs through `RemoteEnv`",
            "",
            f"`collect_groups` with `HFPolicy` (`{a['model']}`), {a['tasks']} val tasks x "
            f"{a['group_size']} episodes, at most 6 turns of 64 new tokens, the same seeds on "
            f"both sides; {a['repeats']} interleaved repeats after an unrecorded warm-up. "
            "`@N`: the model's torch threads (with 1 the server has a core to itself, with 2 it "
            "competes for the model's).",
            "",
            "| contender | episodes / s (median [95% interval]) |",
            "| --- | --- |",
            *(
                f"| {name} | {v['median']:.2f} [{v['ci'][0]:.2f}, {v['ci'][1]:.2f}] |"
                for name, v in eps.items()
            ),
            "",
            *(
                f"- **remote / in process at {t} thread{'s' if t != '1' else ''}: "
                f"{r['median']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]** "
                f"(target >= 0.80: {verdict(r)})."
                for t, r in coll["ratio_by_threads"].items()
            ),
            "",
            "    python -m benchmarks.remote_env",
            "",
        ]
    )


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load, coll = summary["load"], summary["collection"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4))
    left.hist([1000 * v for v in load["latencies_s"]], bins=60, color="tab:blue")
    for q, color in (("p50", "tab:green"), ("p99", "tab:red")):
        left.axvline(1000 * load["latency_s"][q], color=color, linestyle="--", label=q)
    left.set_xlabel("call latency (ms)")
    left.set_ylabel("calls")
    left.set_title(f"{load['sessions']} concurrent sessions")
    left.legend()
    rss = load["rss_mib_after_round"]
    middle.plot(range(len(rss)), rss, marker="o", color="tab:purple")
    middle.set_xlabel("round (0: before)")
    middle.set_ylabel("server RSS (MiB)")
    middle.set_ylim(0, 1.2 * max(rss))
    middle.set_title("server memory")
    names = list(coll["episodes_per_s"])
    for i, name in enumerate(names):
        values = [r["episodes"] / r["wall_s"] for r in coll["runs"][name]]
        right.scatter([i] * len(values), values, alpha=0.6)
        right.hlines(coll["episodes_per_s"][name]["median"], i - 0.2, i + 0.2, color="black")
    right.set_xticks(range(len(names)), names)
    right.set_ylabel("episodes / s")
    right.set_ylim(bottom=0)
    right.set_title("collection with the tiny model")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the main job's SFT model")
    parser.add_argument("--sessions", type=int, default=256, help="concurrent sessions (256)")
    parser.add_argument("--rounds", type=int, default=4, help="episodes per session player (4)")
    parser.add_argument("--tasks", type=int, default=32, help="collection: val tasks (32)")
    parser.add_argument("--group-size", type=int, default=4, help="collection: episodes per task")
    parser.add_argument(
        "--collection-threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="collection: the model's torch threads, each run by both (1 2)",
    )
    add_harness_arguments(parser, repeats=5, threads=2)
    args = parser.parse_args(argv)
    if min(args.collection_threads) < 1:
        parser.error(f"--collection-threads must be >= 1, got {args.collection_threads}")
    if args.quick:
        args.sessions, args.rounds, args.tasks, args.group_size = 16, 2, 4, 2
        args.repeats = args.repeats or 1
    args.repeats = args.repeats or 5
    check_repeats(args.repeats, args.quick)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.model = args.model or default_model("sft")
    threads = pin_threads(args.threads)
    conditions = Conditions.start(
        "remote_env", threads=threads, settings=vars(args) | {"out_dir": None}, quick=args.quick
    )
    process, url = start_server(max(args.sessions, args.tasks * args.group_size))
    try:
        load = run_load(url, process.pid, args.sessions, args.rounds)
        collection = run_collection(url, args)
    finally:
        stop_server(process)
        pin_threads(args.threads)  # the collection set its own; the record ends as it began
    summary = {
        "conditions": conditions.finish().as_json(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load": load,
        "collection": collection,
        "ratio_remote_to_in_process": collection["ratio_remote_to_in_process"],
    }
    print(report(summary))
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_markdown("remote_env", report(summary), out)
        data = dict(summary, load={k: v for k, v in load.items() if k != "latencies_s"})
        write_json("remote_env", data, out)
        plot(summary, out / "remote_env.png")
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
    sys.exit(0)
