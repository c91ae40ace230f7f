"""Action formats: parse an LLM's assistant text into tool calls, and render tools as text.

Use :func:`get_action_format` to get a format by name (``"hermes"`` or ``"json"``), then
:meth:`~ActionFormat.parse` each reply and the ``render_*`` methods to build prompts.
"""

from llm_gym.actions.base import (
    ACTION_FORMATS,
    MAX_TOOL_CALLS,
    ActionFormat,
    ParsedAction,
    ParseKind,
    get_action_format,
    register_action_format,
)
from llm_gym.actions.harmony import HarmonyFormat
from llm_gym.actions.hermes import HermesFormat
from llm_gym.actions.json_format import JsonFormat
from llm_gym.actions.llama3 import Llama3JsonFormat
from llm_gym.actions.mistral import MistralFormat
from llm_gym.actions.qwen3_coder import Qwen3CoderFormat

__all__ = [
    # interface and results
    "ActionFormat",
    "ParsedAction",
    "ParseKind",
    # built-in formats
    "HarmonyFormat",
    "HermesFormat",
    "JsonFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "Qwen3CoderFormat",
    # registry
    "get_action_format",
    "register_action_format",
    "ACTION_FORMATS",
    # limits
    "MAX_TOOL_CALLS",
]
