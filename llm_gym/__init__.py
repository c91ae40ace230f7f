"""llm_gym: gymnasium for LLM agents.

``import llm_gym`` registers every environment with gymnasium, so ``gym.make("ToolUseGame-v0")``
works (it also works without this import, through the start-up hook installed with the package).
Importing llm_gym never imports torch or transformers.

Here: the environment contract (cookbook style), tools, action formats, the gymnasium face and
registration. Document 002's ``EnvironmentMultiTurn`` and its records are the compatibility layer
in :mod:`llm_gym.environments`; rollouts in :mod:`llm_gym.rollout`, policies in
:mod:`llm_gym.policies`, evaluation in :mod:`llm_gym.eval`.
"""

from llm_gym.actions import ActionFormat, ParsedAction, ParseKind, get_action_format
from llm_gym.core import (
    Env,
    FunctionTool,
    Message,
    StepResult,
    SyncEnv,
    Task,
    Tool,
    ToolEnv,
    ToolResult,
    ToolSpec,
    TruncationCause,
    tool,
    tool_to_spec,
)
from llm_gym.envs.builtin import register_builtin_envs
from llm_gym.errors import (
    CalculatorError,
    InvalidArgumentError,
    LlmGymError,
    ToolArgumentError,
    UnknownNameError,
)
from llm_gym.gym import TextEnv, UnicodeText, env_entry, register_env, registered_envs
from llm_gym.tools import CalculatorTool, safe_eval

__version__ = "0.1.0"


__all__ = [
    # environment contract
    "Env",
    "SyncEnv",
    "StepResult",
    "Task",
    "Message",
    "ToolSpec",
    "TruncationCause",
    # tools
    "Tool",
    "ToolResult",
    "FunctionTool",
    "tool",
    "tool_to_spec",
    "ToolEnv",
    "CalculatorTool",
    "safe_eval",
    # actions
    "ActionFormat",
    "ParsedAction",
    "ParseKind",
    "get_action_format",
    # gymnasium
    "TextEnv",
    "UnicodeText",
    "register_env",
    "registered_envs",
    "env_entry",
    # errors
    "LlmGymError",
    "InvalidArgumentError",
    "ToolArgumentError",
    "CalculatorError",
    "UnknownNameError",
    "__version__",
]

register_builtin_envs()
