"""Bridges to other stacks: :mod:`llm_gym.integrations.trl` (TRL's ``GRPOTrainer`` playing our
environments through ``environment_factory``). Each imports its stack only when used."""
