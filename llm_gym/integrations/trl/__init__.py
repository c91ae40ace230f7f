"""TRL's own ``GRPOTrainer`` on llm_gym environments, two ways:

* :mod:`.environment`: our environments as TRL's ``environment_factory``
  (:func:`environment_factory`, :func:`trl_dataset`, :func:`env_reward`, :func:`our_rendering`);
* :mod:`.rollout`: our rollout engine as TRL's ``rollout_func`` (:func:`rollout_func`,
  :func:`rollout_reward`).

Importing this package imports no TRL, torch or transformers code; they load when a trainer
runs.
"""

from llm_gym.integrations.trl.environment import (
    env_reward,
    environment_factory,
    our_rendering,
    task_key,
    trl_dataset,
)
from llm_gym.integrations.trl.rollout import (
    EXTRA_FIELDS,
    RolloutRow,
    TRLRollout,
    rollout_func,
    rollout_reward,
    trl_rollout_output,
)

__all__ = [
    # environment_factory
    "env_reward",
    "environment_factory",
    "our_rendering",
    "task_key",
    "trl_dataset",
    # rollout_func
    "EXTRA_FIELDS",
    "RolloutRow",
    "TRLRollout",
    "rollout_func",
    "rollout_reward",
    "trl_rollout_output",
]
