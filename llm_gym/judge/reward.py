"""``JudgeReward``: a judge as a TRL-style reward function.

``JudgeReward(settings)(prompts, completions, **kwargs)`` returns one value per sample: the
judged score in [0, 1] of each ``(prompt, completion)`` conversation (:class:`~llm_gym.judge.
judge.Judge`), or ``settings.fallback`` where the judge failed (None: no value, so TRL's
``nansum`` and :func:`trainers.grpo.rewards.combined_rewards` add nothing). Prompts and
completions are message lists, or text (a user message and an assistant message). In ``group``
mode the samples with the same prompt are judged together, one request each group.

It plugs in wherever reward functions do: ``train_multi_turn(..., reward_funcs=[JudgeReward(
settings)])``, TRL's ``GRPOTrainer(reward_funcs=...)``, or the trainer's ``judge`` config field
(which adds it with ``settings.weight``). :meth:`JudgeReward.take_metrics` gives the ``judge/...``
counters since its last call (the trainer logs them every step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.judge.judge import Judge, JudgeSettings, shared_judge

__all__ = ["JudgeReward"]


def _messages(value: Any, role: str) -> list[Any]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Mapping):
        return [value]
    return list(value or [])


class JudgeReward:
    """A reward function backed by a judge endpoint (see the module docstring).

    Args:
        judge: :class:`JudgeSettings`, their config mapping, or a :class:`Judge`.
        name: The function's name (its metrics: ``rewards/<name>/mean``).
    """

    def __init__(self, judge: Judge | JudgeSettings | Mapping[str, Any], name: str = "judge"):
        self.judge = judge if isinstance(judge, Judge) else shared_judge(judge)
        self.__name__ = name

    @property
    def settings(self) -> JudgeSettings:
        return self.judge.settings

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        conversations = [
            (_messages(p, "user"), _messages(c, "assistant"))
            for p, c in zip(prompts, completions, strict=True)
        ]
        judged = self.judge.judge(conversations)
        fallback = self.settings.fallback
        return [j.score if j.score is not None else fallback for j in judged]

    def take_metrics(self) -> dict[str, float]:
        """The judge's ``judge/...`` counters since the last call (then reset)."""
        return self.judge.stats.take()
