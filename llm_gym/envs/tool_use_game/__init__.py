"""ToolUseGame-v0: the seeds' reference tool-use environment."""

from llm_gym.envs.tool_use_game.env import (
    FACTS,
    SYSTEM_PROMPT,
    TOOL_USE_GAME_TASKS,
    VERSION,
    ToolUseGameEnv,
    generate_tasks,
    get_tasks,
    list_fact_keys,
    lookup,
    oracle_action,
)

__all__ = [
    "FACTS",
    "SYSTEM_PROMPT",
    "TOOL_USE_GAME_TASKS",
    "VERSION",
    "ToolUseGameEnv",
    "generate_tasks",
    "get_tasks",
    "list_fact_keys",
    "lookup",
    "oracle_action",
]
