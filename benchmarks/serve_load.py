"""Load test of ``llm-gym serve``: many concurrent clients on loopback, bounded in count and time.

The server runs as its own process (``python -m llm_gym.cli serve MODEL --port 0``) with the
tiny model (:func:`llm_gym.models.build_tiny_model`'s default build, taken from the cache when it
is there). ``clients`` threads send chat completions back to back for ``duration_s`` seconds, each
request on a new connection (as :class:`~llm_gym.policies.openai.OpenAIPolicy` does), every
``stream_every``-th one with ``stream=true`` (read to ``data: [DONE]``). Generations are short
(``max_tokens``). Reported: requests per second, latency percentiles (p50, p90, p99, max) from
sending to the last byte, how many connections were reset or refused (must be 0), other errors,
and the server's resident memory (RSS) after the warm-up, at the end and at its highest, sampled
every second (flat memory: the end within a few MiB of the start).

    python -m benchmarks.serve_load            # 64 clients for 30 s; writes results/serve_load.*
    python -m benchmarks.serve_load --quick    # a smoke run (8 clients, 3 s; writes nothing)

Loopback only: the server listens on 127.0.0.1 and nothing else is contacted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    Conditions,
    machine_description,
    thread_settings,
    write_markdown,
)
from benchmarks.procstat import rss_mib

PROMPT = [{"role": "user", "content": "What is 17 + 25? Answer with the number."}]


@dataclass
class Args:
    model: str | None = None
    """A model directory (None: the tiny model's default build, from the cache or built)."""
    clients: int = 64
    """Concurrent clients (threads), each with one request in flight at a time."""
    duration_s: float = 30.0
    """How long the clients send requests (after the warm-up)."""
    max_tokens: int = 8
    """``max_tokens`` of every request (short generations)."""
    stream_every: int = 4
    """Every n-th request of a client streams (0: none)."""
    request_timeout_s: float = 120.0
    """A request that takes longer counts as an error."""
    warmup_requests: int = 4
    """Requests sent one by one before the clients start (not timed)."""
    torch_threads: int = 1
    """The server's torch threads (``OMP_NUM_THREADS``; a tiny model decodes fastest on one)."""
    out_dir: Path = RESULTS_DIR
    write: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> Args:
        """A smoke run: 8 clients for 3 s, nothing written."""
        return cls(
            **{"clients": 8, "duration_s": 3.0, "max_tokens": 2, "write": False, **overrides}
        )


def _threads(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration):
        return None


def start_server(model: str, torch_threads: int) -> tuple[subprocess.Popen[str], int]:
    """``llm-gym serve`` in a child process; returns it and its port."""
    command = [sys.executable, "-m", "llm_gym.cli", "serve", model, "--port", "0", "--quiet"]
    command += ["--model-name", "tiny", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": str(torch_threads)}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    for line in process.stdout:
        match = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # drain the rest
            return process, int(match.group(1))
        if time.monotonic() > deadline:
            break
    process.kill()
    raise SystemExit(f"the server did not start: {' '.join(command)}")


def one_request(port: int, body: bytes, stream: bool, timeout: float) -> tuple[str, int]:
    """Send one request on a new connection; ``("ok" or an error kind, completion tokens)``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(
            "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            return f"http_{response.status}", 0
        if stream:
            if not data.endswith(b"data: [DONE]\n\n"):
                return "stream_unfinished", 0
            return "ok", data.count(b'"delta":{"content"')
        return "ok", json.loads(data)["usage"]["completion_tokens"]
    except ConnectionResetError:
        return "reset", 0
    except ConnectionRefusedError:
        return "refused", 0
    except TimeoutError:
        return "timeout", 0
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return type(exc).__name__, 0
    finally:
        connection.close()


def run_load(args: Args, port: int, pid: int) -> dict[str, Any]:
    bodies = {
        stream: json.dumps(
            {"model": "tiny", "messages": PROMPT, "max_tokens": args.max_tokens, "stream": stream}
        ).encode()
        for stream in (False, True)
    }
    alone = []  # one request at a time: the service time without a queue
    for _ in range(args.warmup_requests):
        sent = time.perf_counter()
        one_request(port, bodies[False], False, args.request_timeout_s)
        alone.append(time.perf_counter() - sent)
    load_at_start = list(os.getloadavg())
    rss: list[tuple[float, float]] = []
    records: list[tuple[float, float, str, int, bool]] = []  # start, latency, outcome, tokens
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + args.duration_s
    done = threading.Event()

    def client(index: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            n += 1
            stream = bool(args.stream_every) and (n + index) % args.stream_every == 0
            sent = time.perf_counter()
            outcome, tokens = one_request(port, bodies[stream], stream, args.request_timeout_s)
            with lock:
                records.append((sent - start, time.perf_counter() - sent, outcome, tokens, stream))

    def sample_memory() -> None:
        while not done.wait(1.0):
            value = rss_mib(pid)
            if value is not None:
                rss.append((time.perf_counter() - start, value))

    rss_start = rss_mib(pid)
    threads_start = _threads(pid)
    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    workers = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    rss_end = rss_mib(pid)
    summary = summarize(args, records, rss, rss_start, rss_end, threads_start, _threads(pid), wall)
    summary["load_average_at_start"] = load_at_start
    summary["alone_s"] = statistics.median(alone[1:] or alone) if alone else None
    return summary


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def summarize(
    args: Args,
    records: list[tuple[float, float, str, int, bool]],
    rss: list[tuple[float, float]],
    rss_start: float | None,
    rss_end: float | None,
    threads_start: int | None,
    threads_end: int | None,
    wall: float,
) -> dict[str, Any]:
    ok = [r for r in records if r[2] == "ok"]
    latencies = [r[1] for r in ok]
    outcomes: dict[str, int] = {}
    for record in records:
        outcomes[record[2]] = outcomes.get(record[2], 0) + 1

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_s": _percentile(values, 50),
            "p90_s": _percentile(values, 90),
            "p99_s": _percentile(values, 99),
            "max_s": max(values, default=0.0),
            "mean_s": statistics.fmean(values) if values else 0.0,
        }

    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
        "machine": machine_description(),
        "load_average_at_end": list(os.getloadavg()),
        "wall_s": wall,
        "requests": len(records),
        "ok": len(ok),
        "outcomes": outcomes,
        "resets": outcomes.get("reset", 0),
        "refused": outcomes.get("refused", 0),
        "errors": len(records) - len(ok),
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "completion_tokens_per_s": sum(r[3] for r in ok) / wall if wall else 0.0,
        "latency": stats(latencies),
        "latency_plain": stats([r[1] for r in ok if not r[4]]),
        "latency_stream": stats([r[1] for r in ok if r[4]]),
        "latencies_s": latencies,
        "slowest": [
            {"sent_at_s": r[0], "latency_s": r[1], "outcome": r[2], "stream": r[4]}
            for r in sorted(records, key=lambda r: -r[1])[:10]
        ],
        "rss_mib": {
            "start": rss_start,
            "end": rss_end,
            "max": max((v for _, v in rss), default=rss_end),
            "samples": rss,
        },
        "server_threads": {"start": threads_start, "end": threads_end},
    }


def write_results(summary: dict[str, Any], out_dir: Path) -> None:
    a, lat, mem = summary["args"], summary["latency"], summary["rss_mib"]
    ms = {k: 1000 * v for k, v in lat.items()}
    growth = (mem["end"] or 0) - (mem["start"] or 0)
    samples = mem["samples"]
    steady = samples[-1][1] - samples[0][1] if samples else 0.0
    lines = [
        "# `llm-gym serve` under load",
        "",
        *([Conditions(**summary["conditions"]).describe(), ""] if "conditions" in summary else []),
        f"{a['clients']} concurrent clients for {a['duration_s']:g} s on loopback against "
        f"`llm-gym serve` (Starlette on uvicorn, one generation at a time) with the tiny model "
        f"(`{a['model']}`); chat completions of at most {a['max_tokens']} tokens, every "
        f"{a['stream_every']}th request streamed, each request on a new connection.",
        "",
        f"Machine: {summary['machine']}. Load average (1, 5, 15 min) when it started: "
        f"{', '.join(f'{x:.2f}' for x in summary['load_average_at_start'])}; at the end: "
        f"{', '.join(f'{x:.2f}' for x in summary['load_average_at_end'])}"
        + (
            " (above the core count: other work was sharing the cores, timings are noisy)"
            if max(summary["load_average_at_start"][0], summary["load_average_at_end"][0])
            > (os.cpu_count() or 1)
            else ""
        )
        + ". Server and clients share the "
        f"cores; the server ran torch on {a['torch_threads']} thread(s) and had "
        f"{summary['server_threads']['start']} threads in all after the warm-up "
        f"and {summary['server_threads']['end']} at the end.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| requests answered | {summary['ok']} of {summary['requests']} |",
        f"| requests per second | {summary['requests_per_s']:.1f} |",
        f"| one request alone (warm-up median) | {1000 * (summary['alone_s'] or 0):.0f} ms |",
        f"| completion tokens per second | {summary['completion_tokens_per_s']:.1f} |",
        f"| latency p50 / p90 / p99 / max | {ms['p50_s']:.0f} / {ms['p90_s']:.0f} / "
        f"{ms['p99_s']:.0f} / {ms['max_s']:.0f} ms |",
        f"| connection resets | **{summary['resets']}** |",
        f"| connections refused | {summary['refused']} |",
        f"| other errors | {summary['errors'] - summary['resets'] - summary['refused']} "
        f"({summary['outcomes']}) |",
        f"| server RSS after warm-up / end / max | {mem['start']:.0f} / {mem['end']:.0f} / "
        f"{mem['max']:.0f} MiB (growth {growth:+.1f} MiB; {steady:+.1f} MiB from the first "
        "sample, 1 s in, to the end) |",
        "",
        "Latency is from sending the request to its last byte; with one generation at a time it "
        "is mostly the queue: about (clients - 1) generations ahead of each request. The "
        "latency distribution and the server's memory over time are in `serve_load.png`; the "
        "ten slowest requests, with when they were sent, in `serve_load.json` (`slowest`).",
        "",
        "    python -m benchmarks.serve_load",
        "",
    ]
    write_markdown("serve_load", "\n".join(lines), out_dir)
    data = {k: v for k, v in summary.items() if k != "latencies_s"}
    (out_dir / "serve_load.json").write_text(json.dumps(data, indent=2) + "\n")
    plot(summary, out_dir / "serve_load.png")


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    latencies_ms = [1000 * v for v in summary["latencies_s"]]
    left.hist(latencies_ms, bins=50, color="tab:blue")
    for name, color in (("p50_s", "tab:green"), ("p99_s", "tab:red")):
        left.axvline(1000 * summary["latency"][name], color=color, linestyle="--", label=name[:3])
    left.set_xlabel("latency (ms)")
    left.set_ylabel("requests")
    left.set_title(f"{summary['ok']} requests, {summary['args']['clients']} clients")
    left.legend()
    samples = summary["rss_mib"]["samples"]
    right.plot([t for t, _ in samples], [v for _, v in samples], color="tab:purple")
    right.set_xlabel("time (s)")
    right.set_ylabel("server RSS (MiB)")
    right.set_ylim(0, 1.2 * max((v for _, v in samples), default=1.0))
    right.set_title("server memory")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Args) -> dict[str, Any]:
    if args.model is None:
        from llm_gym.models import build_tiny_model

        args.model = str(build_tiny_model())
    conditions = Conditions.start(
        "serve_load",
        threads={"server_torch_threads": args.torch_threads, **thread_settings()},
        settings={k: str(v) if isinstance(v, Path) else v for k, v in asdict(args).items()},
    )
    process, port = start_server(args.model, args.torch_threads)
    try:
        summary = run_load(args, port, process.pid)
        summary["conditions"] = conditions.finish().as_json()
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    if args.write:
        write_results(summary, args.out_dir)
    ms = {k: f"{1000 * v:.0f} ms" for k, v in summary["latency"].items()}
    print(
        f"{summary['ok']}/{summary['requests']} ok, {summary['requests_per_s']:.1f} req/s, "
        f"p50 {ms['p50_s']}, p99 {ms['p99_s']}, resets {summary['resets']}, "
        f"RSS {summary['rss_mib']['start']:.0f} -> {summary['rss_mib']['end']:.0f} MiB"
    )
    return summary


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--clients", type=int, default=Args.clients)
    parser.add_argument("--duration-s", type=float, default=Args.duration_s)
    parser.add_argument("--max-tokens", type=int, default=Args.max_tokens)
    parser.add_argument("--stream-every", type=int, default=Args.stream_every)
    parser.add_argument("--torch-threads", type=int, default=Args.torch_threads)
    parser.add_argument("--quick", action="store_true", help="8 clients, 3 s, nothing written")
    parser.add_argument("--no-write", action="store_true")
    ns = parser.parse_args(argv)
    fields = {
        "model": ns.model,
        "clients": ns.clients,
        "duration_s": ns.duration_s,
        "max_tokens": ns.max_tokens,
        "stream_every": ns.stream_every,
        "torch_threads": ns.torch_threads,
    }
    if ns.quick:
        return Args.quick(model=ns.model)
    return Args(**fields, write=not ns.no_write)


if __name__ == "__main__":
    main(parse_args())
