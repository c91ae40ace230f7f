"""Shared fixtures: scripted policies and small helpers; no model is needed here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401  (registers the environments)
from llm_gym.gym import registered_envs


def play_text_episode(
    env: gym.Env, act: Callable[[gym.Env, str, dict[str, Any]], str], **reset
) -> tuple[float, dict[str, Any]]:
    """Run one TextEnv episode with a text policy ``act(env, observation, info) -> action``."""
    observation, info = env.reset(**reset)
    while True:
        observation, reward, terminated, truncated, info = env.step(act(env, observation, info))
        if terminated or truncated:
            return reward, info


@pytest.fixture
def run_async() -> Callable[[Any], Any]:
    return asyncio.run


ENV_IDS = [entry.id for entry in registered_envs()]
