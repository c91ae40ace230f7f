"""``llm-gym serve-mcp ENV_ID``: the command's arguments and what it runs
(:mod:`llm_gym.integrations.mcp.server`; the ``mcp`` SDK is imported only when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, TextIO

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

HELP = "serve an environment's tools as an MCP server (stdio, or streamable HTTP)"
DESCRIPTION = (
    "Serve the tools of one episode of ENV_ID (a task chosen by --split and --index, or "
    "--task-id) to any MCP client: over stdio (the default; an MCP client runs this command), "
    "or streamable HTTP at http://HOST:PORT/mcp with --http. A call that ends the episode says "
    "so, and the next call starts a new one. Needs the interop extra."
)


def add_arguments(
    p: argparse.ArgumentParser, add_task_option: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The ``serve-mcp`` command's arguments (``add_task_option`` adds the CLI's shared
    ``--task-option``)."""
    p.add_argument("env_id", help="e.g. ToolUseGame-v0")
    p.add_argument("--split", default="train", choices=["train", "val", "test"])
    p.add_argument("--index", type=int, default=0, help="the task's index in --split (0)")
    p.add_argument("--task-id", default=None, help="the task's id instead (as serve-env names it)")
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="--http: default 127.0.0.1 (loopback)")
    p.add_argument("--port", type=int, default=8002, help="--http: default 8002 (0: any free)")
    p.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds a reset or call may take (60)"
    )
    p.add_argument("--log", action="store_true", help="--http: log one line per request")
    add_task_option(p)


def run(
    args: argparse.Namespace,
    out: TextIO,
    serve_until_stopped: Callable[[Any, str, TextIO], int],
    assignments: Callable[[list[str]], Mapping[str, Any]],
) -> int:
    """Serve over stdio until the client leaves, or over HTTP until Ctrl-C (``assignments``
    reads ``--task-option KEY=VALUE`` items)."""
    from llm_gym.integrations.mcp import server as mcp_server

    task = {"split": args.split, "index": args.index, "task_id": args.task_id}
    options = {
        "step_timeout_s": args.step_timeout,
        "task_options": assignments(args.task_option),
        **task,
    }
    if not args.http:  # stdout carries the protocol: nothing else may be written there
        return mcp_server.main_stdio(args.env_id, **options)
    server = mcp_server.serve_mcp_http(args.env_id, args.host, args.port, log=args.log, **options)
    line = f"serving the tools of {args.env_id} over MCP at {server.url}"
    return serve_until_stopped(server, line, out)
