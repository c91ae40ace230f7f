"""Document 002's API: ``EnvironmentMultiTurn``, ``EnvironmentSingleTurn`` and their records,
run on llm_gym.

Code written against document 002 runs with only its imports changed::

    from llm_gym.datasets import TaskExample          # was: freesolo.datasets
    from llm_gym.environments import (                # was: freesolo.environments
        EnvironmentEpisode, EnvironmentMultiTurn, EnvironmentSingleTurn, EnvironmentStepResult,
        RewardResult,
    )

An environment object runs in llm_gym's loop, evaluator, gymnasium wrapper and trainer through
:class:`MultiTurnEnvAdapter` (an llm_gym ``Env``): pass the environment (instance or class) where
an env factory is expected, wrap it with :class:`MultiTurnEnvFactory`, or register it with
:func:`register_multi_turn_env`. An :class:`EnvironmentSingleTurn` (``build_prompt_messages``,
``score_response``) runs as a one-turn ``EnvironmentMultiTurn`` (:func:`as_multi_turn`): pass it
where an env factory is expected, or use :func:`single_turn_env_factory` or
:func:`register_single_turn_env`.
"""

from llm_gym.environments.adapter import MultiTurnEnvAdapter
from llm_gym.environments.factory import MultiTurnEnvFactory, MultiTurnTaskSource
from llm_gym.environments.multi_turn import EnvironmentMultiTurn, parse_chatml, sft_messages
from llm_gym.environments.records import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentStepResult,
    EnvironmentTurn,
    RewardResult,
    TaskExample,
)
from llm_gym.environments.registration import MAX_TURNS_CEILING, register_multi_turn_env
from llm_gym.environments.replay import (
    SAMPLED_KEY,
    is_sampled_action,
    replay_state,
    sampled_actions,
)
from llm_gym.environments.scoring import score_episodes_async
from llm_gym.environments.single_turn import (
    EnvironmentSingleTurn,
    SingleTurnAsMultiTurn,
    as_multi_turn,
    register_single_turn_env,
    single_turn_env_factory,
)

__all__ = [
    # the contract
    "EnvironmentMultiTurn",
    "EnvironmentSingleTurn",
    "EnvironmentStepResult",
    "EnvironmentEpisode",
    "EnvironmentTurn",
    "RewardResult",
    "TaskExample",
    "ChatMessage",
    # running it on llm_gym
    "MultiTurnEnvAdapter",
    "MultiTurnEnvFactory",
    "MultiTurnTaskSource",
    "score_episodes_async",
    "register_multi_turn_env",
    "MAX_TURNS_CEILING",
    # single-turn environments on the same machinery
    "as_multi_turn",
    "SingleTurnAsMultiTurn",
    "single_turn_env_factory",
    "register_single_turn_env",
    # stateless replay
    "replay_state",
    "sampled_actions",
    "is_sampled_action",
    "SAMPLED_KEY",
    # SFT
    "sft_messages",
    "parse_chatml",
]
