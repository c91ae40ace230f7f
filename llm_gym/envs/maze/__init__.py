"""Maze-v0: reach the goal of a text grid under partial observation with look and move."""

from llm_gym.envs.maze.env import (
    DIRECTION_ALIASES,
    MAX_CALLS_PER_TURN,
    SYSTEM_PROMPT,
    TURN_BUDGET,
    VERSION,
    MazeEnv,
    oracle_action,
)
from llm_gym.envs.maze.grid import DIRECTIONS, generate_maze, render_maze, shortest_path
from llm_gym.envs.maze.tasks import SPLIT_SIZES, generate_tasks, get_tasks

__all__ = [
    "DIRECTIONS",
    "DIRECTION_ALIASES",
    "MAX_CALLS_PER_TURN",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TURN_BUDGET",
    "VERSION",
    "MazeEnv",
    "generate_maze",
    "generate_tasks",
    "get_tasks",
    "oracle_action",
    "render_maze",
    "shortest_path",
]
