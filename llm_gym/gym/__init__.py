"""The gymnasium face of llm_gym: ``TextEnv``, text spaces and registration."""

from llm_gym.gym.registration import (
    EnvEntry,
    env_entry,
    register_builtin_envs,
    register_env,
    registered_envs,
)
from llm_gym.gym.spaces import UnicodeText
from llm_gym.gym.text_env import SPLITS, TextEnv, render_transcript

__all__ = [
    # environments
    "TextEnv",
    "UnicodeText",
    "SPLITS",
    "render_transcript",
    # registration
    "EnvEntry",
    "register_env",
    "registered_envs",
    "env_entry",
    "register_builtin_envs",
]
