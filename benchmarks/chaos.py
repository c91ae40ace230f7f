"""Chaos run of collection: faulty environments and an endpoint that drops connections.

Episodes run through ``collect_groups_async`` with the real ``OpenAIPolicy`` against a small local
HTTP server (loopback only) that answers like a model (a tool call, then the answer ``42``) and
resets connections: once for about a third of the requests (the client's retry gets through)
and always for the episodes marked ``[policy_down]``. The environment fails by mode (in each
task's prompt): ``reset`` raises, the second ``step`` raises, the first ``step`` hangs (until
``env_timeout_s``), a tool raises with surrogates in its message, a tool result holds surrogates
and a NUL, a step adds a 2 MB message with a surrogate. Every episode no fault touched must
complete; each faulted one must end with its own cause; the whole run must end within a bound.

    python -m benchmarks.chaos                       # writes results/chaos.md
    python -m benchmarks.chaos --tasks-per-mode 2 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    Conditions,
    median_interval,
    write_json,
    write_markdown,
)
from llm_gym import Task, ToolEnv, TruncationCause, tool
from llm_gym.policies import OpenAIPolicy
from llm_gym.rollout import collect_groups_async


@dataclass
class Args:
    tasks_per_mode: int = 10
    """Tasks of each mode (each runs ``episodes_per_task`` episodes)."""
    episodes_per_task: int = 4
    """Episodes per task (the group size)."""
    env_timeout_s: float = 1.0
    """Seconds an environment call may take (the hanging steps end after it)."""
    wall_bound_s: float = 60.0
    """The run fails when it has not ended by then (nothing may hang)."""
    huge_chars: int = 2_000_000
    """Length of the message the ``huge`` mode adds."""
    repeats: int = 5
    """Runs of the whole scenario (the counts must match in every one; the wall time is
    reported as a median with its interval)."""
    out_dir: Path = RESULTS_DIR
    """Where chaos.md and chaos.json go."""
    write: bool = True
    """Write the results file."""


ANSWER = "42"
MODES: dict[str, TruncationCause | None] = {
    # mode: how its episodes must end (None: completed, reward 1)
    "ok": None,
    "tool_raises": None,
    "surrogates": None,
    "huge": None,
    "reset_raises": TruncationCause.ENV,
    "step_raises": TruncationCause.ENV,
    "step_hangs": TruncationCause.ENV,
    "policy_down": TruncationCause.POLICY_ERROR,
}
TOOL_CALL = '<tool_call>{"name": "probe", "arguments": {"note": "look"}}</tool_call>'


def mode_of(text: str) -> str:
    """The mode of a task prompt ``[mode] ...``."""
    return text.split("]", 1)[0].lstrip("[")


# --- the environment -------------------------------------------------------------------------


@tool
def probe(note: str = "") -> str:
    """Look around.

    Args:
        note: Anything.
    """
    return "fine"


@tool
def explode(note: str = "") -> str:
    """Fail the way a tool that quotes undecodable bytes fails.

    Args:
        note: Anything.
    """
    raise ValueError("cannot read b'\\xff' as text: \udcff")


class Chaotic(ToolEnv):
    """The ``probe`` tool, then a reply without a tool call as the answer (target ``42``); what
    goes wrong depends on the task's mode (see the module docstring)."""

    tools = (probe, explode)
    huge_chars = Args.huge_chars

    async def reset(self, task: Task):
        self.mode = mode_of(task.prompt)
        if self.mode == "reset_raises":
            raise RuntimeError("the database is gone \udcff")
        return await super().reset(task)

    async def call_tool(self, name: str, arguments: str) -> tuple[str, bool]:
        if self.mode == "tool_raises":
            return await super().call_tool("explode", arguments)
        if self.mode == "surrogates":
            return "result \ud800 with a NUL \x00 inside", False
        return await super().call_tool(name, arguments)

    async def step(self, message):
        turn = sum(1 for m in self._messages if m.get("role") == "assistant") + 1
        if self.mode == "step_hangs":
            await asyncio.sleep(3600)
        if self.mode == "step_raises" and turn == 2:
            raise OSError("disk full \udcfe")
        result = await super().step(message)
        if self.mode == "huge" and turn == 1:
            self._messages.append({"role": "user", "content": "\ud800" + "x" * self.huge_chars})
            result.messages = list(self._messages)
        return result


# --- the endpoint ----------------------------------------------------------------------------


class DroppingEndpoint:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback that answers like a model and
    drops connections with a TCP reset: always for ``[policy_down]`` episodes, else the first
    attempt of about every third distinct request. ``counts`` tallies resets and answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.counts: collections.Counter[str] = collections.Counter()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                messages = json.loads(raw)["messages"]  # the client sends valid UTF-8 JSON
                digest = hashlib.sha256(raw).hexdigest()
                prompt = next(m["content"] for m in messages if m["role"] == "user")
                with endpoint.lock:
                    first_attempt = digest not in endpoint.seen
                    endpoint.seen.add(digest)
                    drop = mode_of(prompt) == "policy_down" or (
                        first_attempt and int(digest, 16) % 3 == 0
                    )
                    endpoint.counts["reset" if drop else "answered"] += 1
                if drop:  # a TCP reset, no answer
                    self.close_connection = True
                    linger = struct.pack("ii", 1, 0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    self.connection.close()
                    return
                answered = any(m["role"] == "assistant" for m in messages)
                message = {"role": "assistant", "content": ANSWER if answered else TOOL_CALL}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                usage = {"prompt_tokens": 1, "completion_tokens": 1}
                data = json.dumps({"choices": [choice], "usage": usage}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a reset connection is the point, not an error

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


# --- the run ---------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    """What a chaos run did."""

    table: dict[str, dict[str, int]]
    """``table[mode][outcome]``: episodes of each mode by how they ended (``completed`` or the
    truncation cause)."""
    episodes: dict[str, list[Any]]
    """The episode records by task id."""
    wall_s: float
    """Seconds the collection took."""
    endpoint: dict[str, int]
    """The endpoint's tally: ``reset`` connections, ``answered`` requests."""
    expected: dict[str, dict[str, int]] = field(default_factory=dict)
    """What each mode's episodes must have done."""
    repeats: list[ChaosResult] = field(default_factory=list)
    """Every run of :func:`main` (this one is the last)."""

    @property
    def ok(self) -> bool:
        return self.table == self.expected

    def summary(self) -> dict[str, Any]:
        """The runs' counts, tallies and wall times (machine-readable)."""
        runs = self.repeats or [self]
        walls = median_interval([r.wall_s for r in runs])
        return {
            "wall_s": {**walls.as_json(), "coverage": walls.coverage, "method": walls.method},
            "all_as_expected": all(r.ok for r in runs),
            "expected": self.expected,
            "runs": [
                {"table": r.table, "endpoint": r.endpoint, "wall_s": r.wall_s, "ok": r.ok}
                for r in runs
            ],
        }


def run(args: Args) -> ChaosResult:
    """One chaos collection; raises ``TimeoutError`` if it outlasts ``args.wall_bound_s``."""
    endpoint = DroppingEndpoint()
    policy = OpenAIPolicy(
        "chaos",
        endpoint.url,
        max_retries=2,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=10.0,
        max_concurrency=16,
    )
    tasks = [
        Task(f"[{mode}] task {i}: what is the answer?", target=ANSWER, id=f"{mode}-{i}")
        for mode in MODES
        for i in range(args.tasks_per_mode)
    ]
    env = type("Chaotic", (Chaotic,), {"huge_chars": args.huge_chars})

    async def collect() -> list[list[Any]]:
        collection = collect_groups_async(
            env,
            tasks,
            policy,
            episodes_per_task=args.episodes_per_task,
            max_turns=3,
            env_timeout_s=args.env_timeout_s,
        )
        return await asyncio.wait_for(collection, args.wall_bound_s)

    started = time.perf_counter()
    try:
        groups = asyncio.run(collect())
    finally:
        policy.close()
        endpoint.close()
    wall_s = time.perf_counter() - started
    table: dict[str, collections.Counter[str]] = {mode: collections.Counter() for mode in MODES}
    episodes: dict[str, list[Any]] = collections.defaultdict(list)
    for group in groups:
        for episode in group:
            completed = episode.terminated and episode.reward == 1.0
            outcome = "completed" if completed else str(episode.truncation_cause or "wrong")
            table[mode_of(episode.task.prompt)][outcome] += 1
            episodes[episode.task.id].append(episode)
    per_mode = args.tasks_per_mode * args.episodes_per_task
    expected = {mode: {str(cause or "completed"): per_mode} for mode, cause in MODES.items()}
    return ChaosResult(
        {mode: dict(counts) for mode, counts in table.items()},
        dict(episodes),
        wall_s,
        dict(endpoint.counts),
        expected,
    )


def render(args: Args, result: ChaosResult, conditions: Conditions) -> str:
    total = sum(sum(counts.values()) for counts in result.table.values())
    summary = result.summary()
    lines = [
        "# Chaos run of collection",
        "",
        conditions.describe(),
        "",
        f"{total} episodes ({args.tasks_per_mode} tasks x {args.episodes_per_task} episodes per "
        f"mode), `OpenAIPolicy` (max_retries=2) against a loopback endpoint that reset "
        f"{result.endpoint.get('reset', 0)} connections and answered "
        f"{result.endpoint.get('answered', 0)} requests; `env_timeout_s={args.env_timeout_s}`.",
        "",
        "| mode | fault | episodes | completed | ended as | as expected |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    faults = {
        "ok": "none (connections dropped once at random)",
        "tool_raises": "a tool raises, surrogates in its message",
        "surrogates": "a tool result holds surrogates and a NUL",
        "huge": "a step adds a 2 MB message with a surrogate",
        "reset_raises": "reset raises",
        "step_raises": "the second step raises",
        "step_hangs": "the first step hangs",
        "policy_down": "every connection of the episode reset",
    }
    for mode, counts in result.table.items():
        ended = ", ".join(f"{k}: {v}" for k, v in counts.items() if k != "completed") or "-"
        lines.append(
            f"| {mode} | {faults[mode]} | {sum(counts.values())} | {counts.get('completed', 0)} "
            f"| {ended} | {'yes' if counts == result.expected[mode] else 'NO'} |"
        )
    wall = summary["wall_s"]
    lines += [
        "",
        f"The table is the last of {len(summary['runs'])} runs; every run's counts matched the "
        f"expected ones: {'yes' if summary['all_as_expected'] else 'NO'} (all runs in "
        f"`chaos.json`). A collection took {wall['median']:.1f} s, median over the runs "
        f"[{wall['ci'][0]:.1f}, {wall['ci'][1]:.1f}] ({wall['coverage']:.1%} order-statistic "
        f"interval; bound {args.wall_bound_s:g} s).",
        "",
    ]
    return "\n".join(lines)


def main(args: Args) -> ChaosResult:
    conditions = Conditions.start("chaos", settings=asdict(args))
    runs = [run(args) for _ in range(max(1, args.repeats))]
    conditions.finish()
    result = runs[-1]
    result.repeats = runs
    text = render(args, result, conditions)
    print(text)
    if args.write:
        path = write_markdown("chaos", text, args.out_dir)
        write_json("chaos", {"conditions": conditions.as_json(), **result.summary()}, args.out_dir)
        print(f"wrote {path} and chaos.json")
    return result


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks-per-mode", type=int, default=Args.tasks_per_mode)
    parser.add_argument("--episodes-per-task", type=int, default=Args.episodes_per_task)
    parser.add_argument("--env-timeout-s", type=float, default=Args.env_timeout_s)
    parser.add_argument("--wall-bound-s", type=float, default=Args.wall_bound_s)
    parser.add_argument("--repeats", type=int, default=Args.repeats)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-write", dest="write", action="store_false")
    ns = parser.parse_args(argv)
    return Args(
        tasks_per_mode=ns.tasks_per_mode,
        episodes_per_task=ns.episodes_per_task,
        env_timeout_s=ns.env_timeout_s,
        wall_bound_s=ns.wall_bound_s,
        repeats=ns.repeats,
        out_dir=ns.out_dir,
        write=ns.write,
    )


if __name__ == "__main__":
    main(parse_args())
