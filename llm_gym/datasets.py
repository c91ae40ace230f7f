"""Dataset rows as document 002 imports them (``from freesolo.datasets import TaskExample``)."""

from llm_gym.environments.records import TaskExample

__all__ = ["TaskExample"]
