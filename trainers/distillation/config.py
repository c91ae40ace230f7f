"""On-policy distillation (document 002's OPD) on the multi-turn trainer.

The student samples its own episodes, exactly as in GRPO; a teacher (a model loaded in process,
or an OpenAI-compatible server that returns prompt logprobs, :mod:`trainers.distillation.teacher`)
scores every token the student sampled. The per-token reverse KL on the sampled token,
``log pi_student(x_t) - log pi_teacher(x_t)``, is the learning signal: its negative is each
policy token's advantage (the on-policy distillation of Agarwal et al. 2024 and Thinking
Machines' 2025 recipe, with no discount), so the policy-gradient loss the trainer already runs
lowers the KL. Environment and tool tokens carry no advantage and are never trained.
``reward_weight`` adds GRPO's group-relative advantage of the environment's reward (it needs
groups of two or more); ``episodes_per_task=1`` is the natural setting otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DistillationConfig", "build_teacher", "distill_batch", "teacher_sequences"]


@dataclass(frozen=True)
class DistillationConfig:
    """The ``distillation`` settings of :class:`~trainers.MultiTurnGRPOConfig` (a mapping with
    these keys there, and a ``distillation:`` section in ``train.py`` configs)."""

    teacher: str | dict[str, Any] = ""
    """A model path or hub id (loaded with ``from_pretrained``), or ``{"base_url": URL,
    "model": NAME, "api_key": ...}`` for an OpenAI-compatible server that returns prompt
    logprobs (vLLM's ``prompt_logprobs``, or ``echo`` with ``logprobs``)."""
    kl_coef: float = 1.0
    """Weight of the reverse-KL advantage."""
    reward_weight: float = 0.0
    """Weight of GRPO's advantage from the environment's reward (0: distillation only)."""
    teacher_batch_size: int = 8
    """Sequences per teacher forward pass (or concurrent requests to a server)."""


def teacher_spec(settings: DistillationConfig, device: Any = None) -> dict[str, Any]:
    """``settings.teacher`` as :func:`trainers.distillation.teacher.teacher_from_config` reads it,
    with ``teacher_batch_size`` (a local teacher's batch, or a server's concurrent requests) and the
    trainer's ``device`` filled in when the teacher does not set them.

    Example:
        >>> teacher_spec(DistillationConfig(teacher="models/sft", teacher_batch_size=4), "cpu")
        {'model': 'models/sft', 'batch_size': 4, 'device': 'cpu'}
    """
    spec = (
        {"model": settings.teacher} if isinstance(settings.teacher, str) else dict(settings.teacher)
    )
    if "base_url" in spec:
        spec.setdefault("max_concurrency", settings.teacher_batch_size)
    else:
        spec.setdefault("batch_size", settings.teacher_batch_size)
        if device is not None:
            spec.setdefault("device", device)
    return spec


def build_teacher(settings: DistillationConfig, device: Any = None) -> Any:
    """The teacher of ``settings`` (loaded, or connected to), on ``device`` when local."""
    from trainers.distillation.teacher import teacher_from_config

    return teacher_from_config(teacher_spec(settings, device))


def teacher_sequences(batch: dict[str, Any]) -> tuple[list[tuple[list[int], int]], list[int]]:
    """Each training row's tokens as the teacher reads them, ``(prompt + completion, len(prompt))``
    without padding, and the rows they belong to (rows with no policy token are skipped).

    Example:
        >>> import torch
        >>> batch = {
        ...     "prompt_ids": torch.tensor([[0, 5, 6]]), "prompt_mask": torch.tensor([[0, 1, 1]]),
        ...     "completion_ids": torch.tensor([[7, 8, 0]]),
        ...     "completion_mask": torch.tensor([[1, 1, 0]]),
        ...     "tool_mask": torch.tensor([[1, 0, 0]]),
        ... }
        >>> teacher_sequences(batch)
        ([([5, 6, 7, 8], 2)], [0])
    """
    sequences, rows = [], []
    trains = (batch["completion_mask"] * batch["tool_mask"]).sum(1)
    for i in range(batch["prompt_ids"].size(0)):
        if not trains[i]:
            continue
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        sequences.append((prompt + completion, len(prompt)))
        rows.append(i)
    return sequences, rows


def distill_batch(
    batch: dict[str, Any], teacher: Any, settings: DistillationConfig
) -> tuple[float, int]:
    """Score the batch's sampled tokens with ``teacher`` and make its advantages on-policy
    distillation's: ``reward_weight * advantages + kl_coef * (teacher - student)`` on policy
    tokens (the student's logprobs are the sampler's, ``sampling_per_token_logps``), 0 elsewhere.
    Returns the summed per-token reverse KL estimate and the number of policy tokens."""
    import torch

    from trainers.distillation.teacher import reverse_kl_advantages

    mask = (batch["completion_mask"] * batch["tool_mask"]).float()
    student = batch["sampling_per_token_logps"].float()
    teacher_logps = torch.zeros_like(student)
    sequences, rows = teacher_sequences(batch)
    if sequences:
        scored = teacher.logprobs(sequences)
        for row, values in zip(rows, scored, strict=True):
            teacher_logps[row, : len(values)] = torch.tensor(values, dtype=teacher_logps.dtype)
    kl = reverse_kl_advantages(student, teacher_logps, mask, kl_coef=settings.kl_coef)
    batch["advantages"] = settings.reward_weight * batch["advantages"] + kl
    tokens = int(mask.sum())
    return float(((student - teacher_logps) * mask).sum()), tokens
