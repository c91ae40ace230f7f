"""reasoning-gym's procedural generators as llm_gym environments: ``ReasoningGym-v0`` (any
dataset, ``dataset=...``) and one id per chosen family (``RG-ChainSum-v0``, ...).

Importing this package does not import reasoning-gym; the first task or score does.
"""

from llm_gym.envs.reasoning_gym.env import (
    SYSTEM_PROMPT,
    VERSION,
    ReasoningGymEnv,
    Score,
    oracle_action,
    parse_answer,
    score_answer,
)
from llm_gym.envs.reasoning_gym.tasks import (
    DEFAULT_DATASET,
    SPLIT_SIZES,
    DatasetTasks,
    basic_arithmetic_tasks,
    chain_sum_tasks,
    dataset_names,
    family_relationships_tasks,
    get_tasks,
    spell_backward_tasks,
    word_sorting_tasks,
)
from llm_gym.envs.reasoning_gym.text_env import ReasoningGymTextEnv

__all__ = [
    "DEFAULT_DATASET",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "VERSION",
    "DatasetTasks",
    "ReasoningGymEnv",
    "ReasoningGymTextEnv",
    "Score",
    "basic_arithmetic_tasks",
    "chain_sum_tasks",
    "dataset_names",
    "family_relationships_tasks",
    "get_tasks",
    "oracle_action",
    "parse_answer",
    "score_answer",
    "spell_backward_tasks",
    "word_sorting_tasks",
]
