"""The gymnasium face of llm_gym: ``TextEnv``, text spaces and registration."""

from llm_gym.core.registry import EnvEntry, env_entry, registered_envs
from llm_gym.gym.registration import register_env, unregister_env
from llm_gym.gym.spaces import UnicodeText
from llm_gym.gym.text_env import TextEnv, render_transcript

__all__ = [
    # environments
    "TextEnv",
    "UnicodeText",
    "render_transcript",
    # registration (the catalogue itself lives in llm_gym.core.registry)
    "register_env",
    "unregister_env",
    "EnvEntry",
    "env_entry",
    "registered_envs",
]
