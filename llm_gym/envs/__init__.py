"""The environment contract (as the seeds import it from ``...envs``) and the environments.

Each environment lives in its own sub-package (``llm_gym.envs.tool_use_game``, ...).
"""

from llm_gym.core import (
    Env,
    FunctionTool,
    Message,
    StepResult,
    Task,
    Tool,
    ToolEnv,
    ToolResult,
    ToolSpec,
    TruncationCause,
    tool,
    tool_to_spec,
)

__all__ = [
    "Env",
    "FunctionTool",
    "Message",
    "StepResult",
    "Task",
    "Tool",
    "ToolEnv",
    "ToolResult",
    "ToolSpec",
    "TruncationCause",
    "tool",
    "tool_to_spec",
]
