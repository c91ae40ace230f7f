"""Math-v0: arithmetic word problems with the calculator tool, scored on the exact answer."""

from llm_gym.envs.math.env import (
    SPLIT_SIZES,
    SYSTEM_PROMPT,
    TEMPLATES,
    VERSION,
    MathEnv,
    canonical_answer,
    exact_value,
    generate_tasks,
    get_tasks,
    oracle_action,
)

__all__ = [
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TEMPLATES",
    "VERSION",
    "MathEnv",
    "canonical_answer",
    "exact_value",
    "generate_tasks",
    "get_tasks",
    "oracle_action",
]
