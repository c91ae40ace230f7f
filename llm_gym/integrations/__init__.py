"""Bridges to other stacks, one subpackage each, each importing its stack only when used (the
``interop`` extra):

* :mod:`~llm_gym.integrations.trl`: TRL's ``GRPOTrainer`` playing our environments through
  ``environment_factory``, or with our rollout engine as its ``rollout_func``.
* :mod:`~llm_gym.integrations.openenv`: OpenEnv both ways: ``llm-gym serve-env`` (``serve_env``)
  and ``RemoteEnv`` (``gym.make("OpenEnv-v0")``, ``register_remote_env``).
* :mod:`~llm_gym.integrations.verifiers`: verifiers environments in our loop, and ours as
  verifiers environments.
* :mod:`~llm_gym.integrations.mcp`: MCP servers' tools in any environment (``MCPToolEnv``,
  ``with_mcp_tools``; stdio and streamable HTTP), and an environment's tools served over MCP
  (``llm-gym serve-mcp``).

reasoning-gym's generators are environments: :mod:`llm_gym.envs.reasoning_gym`.
"""
