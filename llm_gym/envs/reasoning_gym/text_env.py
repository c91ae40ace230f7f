"""``ReasoningGymTextEnv``: the gymnasium face of the reasoning-gym ids, with their options as
``gym.make`` keywords (``gym.make("ReasoningGym-v0", dataset="chain_sum")``)."""

from __future__ import annotations

from typing import Any

from llm_gym.envs.reasoning_gym.tasks import check_dataset
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym.text_env import TextEnv

__all__ = ["TASK_OPTION_KEYWORDS", "ReasoningGymTextEnv"]

TASK_OPTION_KEYWORDS = (
    "dataset",
    "config",
    "task_seed",
    "max_attempts",
    "sizes",
    "generation_timeout_s",
)
"""The ``gym.make`` keywords that are options of the task source (see ``get_tasks``)."""


class ReasoningGymTextEnv(TextEnv):
    """A :class:`~llm_gym.gym.TextEnv` whose task options may also come as keywords.

    ``gym.make("ReasoningGym-v0", dataset="chain_sum", max_attempts=3)`` is
    ``gym.make("ReasoningGym-v0", task_options={"dataset": "chain_sum", "max_attempts": 3})``;
    the per-family ids (``RG-ChainSum-v0``, ...) take every keyword but ``dataset``. A keyword
    left at None is not passed; the same option as a keyword and in ``task_options`` is an
    error. An unknown dataset fails here, at ``gym.make``, with the list of allowed names.
    Everything else is :class:`~llm_gym.gym.TextEnv`'s.
    """

    def __init__(
        self,
        env: Any,
        tasks: Any,
        *,
        dataset: str | None = None,
        config: dict[str, Any] | None = None,
        task_seed: int | None = None,
        max_attempts: int | None = None,
        sizes: dict[str, int] | None = None,
        generation_timeout_s: float | None = None,
        task_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        given = {
            "dataset": dataset,
            "config": config,
            "task_seed": task_seed,
            "max_attempts": max_attempts,
            "sizes": sizes,
            "generation_timeout_s": generation_timeout_s,
        }
        options = dict(task_options or {})
        for key, value in given.items():
            if value is None:
                continue
            if key in options:
                raise InvalidArgumentError(
                    f"{key} was given twice, as a keyword ({value!r:.80}) and in task_options "
                    f"({options[key]!r:.80}); give it once."
                )
            options[key] = value
        if "dataset" in options:
            check_dataset(options["dataset"])
        super().__init__(env, tasks, task_options=options or None, **kwargs)
