"""GuessNumber-v0: find a secret integer in a range from higher/lower feedback."""

from llm_gym.envs.guess_number.env import (
    SYSTEM_PROMPT,
    VERSION,
    GuessNumberEnv,
    generate_tasks,
    get_tasks,
    make_task,
    oracle_action,
    parse_guess,
    turn_reward,
)

__all__ = [
    "SYSTEM_PROMPT",
    "VERSION",
    "GuessNumberEnv",
    "generate_tasks",
    "get_tasks",
    "make_task",
    "oracle_action",
    "parse_guess",
    "turn_reward",
]
