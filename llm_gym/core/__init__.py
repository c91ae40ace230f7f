"""The environment contract: tasks, messages, tools, steps and environments."""

from llm_gym.core.env import Env, StepResult, SyncEnv, TruncationCause
from llm_gym.core.factories import (
    SPLITS,
    EnvFactory,
    Oracle,
    TaskSource,
    as_env_factory,
    as_task,
    as_task_source,
    register_env_adapter,
    resolve,
)
from llm_gym.core.registry import EnvEntry, env_entry, registered_envs
from llm_gym.core.task import Task
from llm_gym.core.text import clean_json, clean_message, clean_text
from llm_gym.core.tool import FunctionTool, Tool, ToolResult, decode_arguments, tool, tool_to_spec
from llm_gym.core.tool_env import ToolEnv, answers_match, extract_answer
from llm_gym.core.types import (
    FrozenList,
    FrozenMessage,
    FunctionCall,
    FunctionSpec,
    Message,
    ToolCall,
    ToolSpec,
    freeze_message,
    freeze_spec,
)

__all__ = [
    # records
    "Task",
    "Message",
    "FrozenMessage",
    "FrozenList",
    "freeze_message",
    "freeze_spec",
    "ToolCall",
    "FunctionCall",
    "ToolSpec",
    "FunctionSpec",
    "StepResult",
    # valid text
    "clean_text",
    "clean_message",
    "clean_json",
    "TruncationCause",
    # tools
    "Tool",
    "ToolResult",
    "FunctionTool",
    "tool",
    "tool_to_spec",
    "decode_arguments",
    # environments
    "Env",
    "SyncEnv",
    "ToolEnv",
    "answers_match",
    "extract_answer",
    # resolution
    "EnvFactory",
    "TaskSource",
    "Oracle",
    "SPLITS",
    "as_env_factory",
    "as_task_source",
    "as_task",
    "resolve",
    "register_env_adapter",
    # the catalogue
    "EnvEntry",
    "env_entry",
    "registered_envs",
]
