"""Wordle-v0: guess a five-letter word in six tries from per-letter feedback."""

from llm_gym.envs.wordle.env import (
    SYSTEM_PROMPT,
    VERSION,
    WordleEnv,
    generate_tasks,
    get_tasks,
    make_task,
    oracle_action,
    parse_guess,
    read_feedback,
    turn_reward,
)
from llm_gym.envs.wordle.rules import WORDS, check_guess, score_guess

__all__ = [
    "SYSTEM_PROMPT",
    "VERSION",
    "WORDS",
    "WordleEnv",
    "check_guess",
    "generate_tasks",
    "get_tasks",
    "make_task",
    "oracle_action",
    "parse_guess",
    "read_feedback",
    "score_guess",
    "turn_reward",
]
