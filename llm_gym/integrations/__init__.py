"""Bridges to other stacks, each importing its stack only when used (the ``interop`` extra):

* :mod:`~llm_gym.integrations.trl`: TRL's ``GRPOTrainer`` playing our environments through
  ``environment_factory``; :mod:`~llm_gym.integrations.trl_rollout`: our rollout engine as its
  ``rollout_func``.
* :mod:`~llm_gym.integrations.openenv_server` (``llm-gym serve-env``) and
  :mod:`~llm_gym.integrations.openenv_client` (``RemoteEnv``, ``gym.make("OpenEnv-v0")``):
  OpenEnv both ways.
* :mod:`~llm_gym.integrations.verifiers`: verifiers environments in our loop, and ours as
  verifiers environments.

reasoning-gym's generators are environments: :mod:`llm_gym.envs.reasoning_gym`.
"""
