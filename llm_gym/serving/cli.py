"""``llm-gym serve MODEL``: the command's arguments and what it runs (:func:`.serve`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from llm_gym.policies.loading import TORCH_DTYPES
from llm_gym.policies.template_render import DEFAULT_RENDER_DEADLINE_S
from llm_gym.policies.template_tools import TEMPLATE_TOOLS_MODES
from llm_gym.serving import access

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

HELP = "serve a local model over an OpenAI-compatible API (/v1/chat/completions, /v1/completions)"
DESCRIPTION = (
    "Serve MODEL (a model folder, a .gguf file, a packaged model's name or a hub id) to any "
    "OpenAI-compatible client. A request's tools are rendered by the chat template, or, when "
    "the template cannot render tools, written into the system message by the --tool-parser "
    "action format (--template-tools require refuses such a model instead). Only this "
    "machine's clients and web pages are answered unless --allowed-hosts and --allowed-origins "
    "allow more."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` command's arguments."""
    p.add_argument(
        "model_path", help="a model folder, a .gguf file, a packaged model's name or a hub id"
    )
    p.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8000, help="default: 8000 (0: any free port)")
    p.add_argument("--model-name", default=None, help="the id clients send (default: the path)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument(
        "--dtype", default="float32", choices=TORCH_DTYPES, help="torch dtype of the weights"
    )
    p.add_argument("--max-tokens", type=int, default=256, help="when a request sets none")
    p.add_argument(
        "--chat-template", default=None, metavar="NAME|PATH.jinja",
        help="the chat template for a model without one (a base model): chatml, gemma, or a "
        ".jinja file (default: the model's own; a model with none is refused)",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no log line per request")
    p.add_argument(
        "--render-deadline-s", type=float, default=DEFAULT_RENDER_DEADLINE_S, metavar="SECONDS",
        help="seconds one render of the chat template may take, at start-up and per request (a "
        f"model file's template is untrusted code; default: {DEFAULT_RENDER_DEADLINE_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--tool-parser",
        default="auto",
        help="the action format that parses tool calls out of replies to requests with tools "
        "(and writes the tools for a template that cannot render them); default auto: the one "
        "the chat template teaches (llama3_json, mistral, qwen3_coder, harmony, hermes), "
        "hermes for a template that teaches none",
    )
    p.add_argument(
        "--template-tools",
        default="fallback",
        choices=TEMPLATE_TOOLS_MODES,
        help="a chat template that cannot render tools: fallback (default: the tools as text "
        "in the system message) or require (refuse to serve it)",
    )
    p.add_argument(
        "--template-kwargs",
        default=None,
        help="comma-separated chat_template_kwargs names clients may set (default: "
        "enable_thinking,thinking,reasoning_effort; client templates are always refused: a name "
        "holding 'template', such as chat_template, or one of apply_chat_template's own "
        "arguments is refused at startup)",
    )
    access.add_arguments(p)


def run(args: argparse.Namespace, out: TextIO, until_stopped: Callable[..., int]) -> int:
    """Start the server of ``args`` and serve until ``until_stopped`` returns."""
    from llm_gym.serving import serve
    from llm_gym.serving.chat_protocol import check_template_kwargs_allowlist

    options: dict[str, Any] = {}
    if args.template_kwargs is not None:  # refused here, before the model loads
        names = [n.strip() for n in args.template_kwargs.split(",") if n.strip()]
        options["chat_template_kwargs"] = check_template_kwargs_allowlist(names)
    server = serve(
        args.model_path,
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        device=args.device,
        dtype=args.dtype,
        chat_template=args.chat_template,
        default_max_tokens=args.max_tokens,
        log=not args.quiet,
        tool_parser=args.tool_parser,
        template_tools=args.template_tools,
        access=access.policy_from_args(args),
        render_deadline_s=args.render_deadline_s,
        **options,
    )
    return until_stopped(server, f"serving {server.model_name!r} at {server.url}", out)
