"""The exceptions llm_gym raises.

Every error derives from :class:`LlmGymError` and also from the builtin that matches its meaning,
so ``except ValueError`` keeps working for callers that do not know about llm_gym.
Messages say what was expected, what came, and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [  # the exception classes; did_you_mean (below) is the registries' shared hint
    "CalculatorError",
    "ChatTemplateError",
    "EnvTimeoutError",
    "InvalidArgumentError",
    "LlmGymError",
    "MCPServerError",
    "RemoteEnvError",
    "SandboxUnavailableError",
    "ToolArgumentError",
    "ToolCallError",
    "TokenizerError",
    "UnknownNameError",
]


class LlmGymError(Exception):
    """Root of every error raised by llm_gym."""


class InvalidArgumentError(LlmGymError, ValueError):
    """A caller passed a value outside what a function or config accepts."""


class ToolArgumentError(LlmGymError, ValueError):
    """A tool was called with arguments that do not match its parameter schema."""


class CalculatorError(LlmGymError, ValueError):
    """The safe arithmetic evaluator refused or could not evaluate an expression."""


class ChatTemplateError(LlmGymError, ValueError):
    """A model's chat template is missing, or raised while rendering a conversation; an
    episode it ends is ``TruncationCause.TEMPLATE``, never an environment's error."""


class TokenizerError(LlmGymError, ValueError):
    """A tokenizer failed to encode or decode an episode's text; the episode it ends is
    ``TruncationCause.TOKENIZER``, never an environment's error."""


class EnvTimeoutError(LlmGymError, TimeoutError):
    """An environment call outlasted its time limit and was cancelled (the episode driver's
    ``env_timeout_s``)."""


class RemoteEnvError(LlmGymError, ConnectionError):
    """A remote environment (an OpenEnv server) could not be reached, answered with an error,
    or outlasted its per-call deadline; the episode that used it ends (cause ``ENV``)."""


class MCPServerError(LlmGymError, ConnectionError):
    """An MCP server could not be started or reached, outlasted its deadline, or broke off
    mid-episode: at reset the episode ends (cause ``ENV``); during a tool call the model gets a
    ``tool_error`` message and the episode goes on."""


class ToolCallError(LlmGymError, RuntimeError):
    """A tool answered that its call failed (an MCP result marked ``isError``); the model sees
    the tool's text as a ``tool_error`` message."""


class SandboxUnavailableError(LlmGymError, RuntimeError):
    """The code sandbox (bubblewrap with a libseccomp filter) cannot run on this machine; the
    message names what to install, and the explicitly unsafe mode that runs without it."""


class UnknownNameError(LlmGymError, KeyError):
    """A registry lookup (environment id, action format, policy) found no such name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the choice closest to ``name``, or ``""`` when none is close:
    the hint every registry lookup appends to its error.

    Example:
        >>> did_you_mean("randm", ["random", "oracle"]), did_you_mean("zzz", ["random"])
        (" Did you mean 'random'?", '')
    """
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
