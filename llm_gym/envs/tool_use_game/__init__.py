"""ToolUseGame-v0: the seeds' reference tool-use environment."""

from llm_gym.envs.tool_use_game.demonstrators import HastyOracle, hasty_oracle_action, oracle_action
from llm_gym.envs.tool_use_game.env import (
    DEFAULT_WORLD_SEED,
    FACTS,
    NEW_WORLD_SEED,
    SYSTEM_PROMPT,
    TOOL_USE_GAME_TASKS,
    VERSION,
    ToolUseGameEnv,
    generate_tasks,
    get_tasks,
    list_fact_keys,
    lookup,
    task_world,
    world_facts,
)

__all__ = [
    "DEFAULT_WORLD_SEED",
    "FACTS",
    "HastyOracle",
    "NEW_WORLD_SEED",
    "SYSTEM_PROMPT",
    "TOOL_USE_GAME_TASKS",
    "VERSION",
    "ToolUseGameEnv",
    "generate_tasks",
    "get_tasks",
    "hasty_oracle_action",
    "list_fact_keys",
    "lookup",
    "oracle_action",
    "task_world",
    "world_facts",
]
