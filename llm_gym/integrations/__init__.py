"""Bridges to other stacks, each importing its stack only when used (the ``interop`` extra):

* :mod:`~llm_gym.integrations.trl`: TRL's ``GRPOTrainer`` playing our environments through
  ``environment_factory``; :mod:`~llm_gym.integrations.trl_rollout`: our rollout engine as its
  ``rollout_func``.
* :mod:`~llm_gym.integrations.openenv_server` (``llm-gym serve-env``) and
  :mod:`~llm_gym.integrations.openenv_client` (``RemoteEnv``, ``gym.make("OpenEnv-v0")``):
  OpenEnv both ways.
* :mod:`~llm_gym.integrations.verifiers`: verifiers environments in our loop, and ours as
  verifiers environments.
* :mod:`~llm_gym.integrations.mcp_env` (``MCPToolEnv``, ``with_mcp_tools``): MCP servers'
  tools in any environment (:mod:`~llm_gym.integrations.mcp_client`, stdio and streamable
  HTTP); :mod:`~llm_gym.integrations.mcp_server` (``llm-gym serve-mcp``): an environment's
  tools served over MCP.

reasoning-gym's generators are environments: :mod:`llm_gym.envs.reasoning_gym`.
"""
