"""The field of :class:`~trainers.grpo.config.multi_turn.MultiTurnGRPOConfig` that chooses the
precision of sampling and training (:mod:`trainers.grpo.precision`), its check, and how it
combines with transformers' ``bf16``.

=============  ===========  ================================================================
``dtype``      ``bf16``     sampling / training
=============  ===========  ================================================================
``"auto"``     None         a GPU: the weights / bf16 autocast where it supports bf16;
                            a CPU: the start-up probe decides each (in the trainer, with the
                            model's shapes)
``"auto"``     True, False  the weights / as ``bf16`` says (no probe)
``"float32"``  None, False  fp32 / fp32
``"bfloat16"`` None, True   bf16 / bf16 autocast
``"float32"``  True         refused (a contradiction)
``"bfloat16"`` False        refused (a contradiction)
=============  ===========  ================================================================

``fp16=True`` trains in fp16 and samples in the weights' dtype under ``"auto"``; with
``"bfloat16"`` it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = ["DTYPES", "DtypeFields", "Precision", "check_dtype", "gpu_support", "static_precision"]

DTYPES = ("auto", "float32", "bfloat16")
"""The values ``dtype`` takes."""


@dataclass
class DtypeFields:
    """``dtype`` (a base of the trainer's config)."""

    dtype: str = field(
        default="auto",
        metadata={
            "help": "Precision of sampling and training: auto, float32 or bfloat16. bfloat16 "
            "samples from a bf16 copy of the weights (the in-process generators; vLLM samples "
            "in its own dtype) and trains under bf16 autocast (bf16=True; the weights and the "
            "optimizer stay fp32). auto: on a CPU a start-up probe times matmuls at the "
            "model's shapes in fp32 and bf16 and picks bf16 for sampling, and for training, "
            "where it is clearly faster (AMX, AVX-512 BF16), else fp32; on a GPU bf16 autocast "
            "training where the GPU supports it (sampling from the weights as they are); an "
            "explicit bf16 decides training only. The choice and the probe's times are "
            "logged at start (precision/... in the first step's record). A sampler "
            "in bf16 has its logprob gap to the trainer logged and corrected as vLLM's "
            "(vllm_importance_sampling_correction). float32 or bfloat16 skip the probe; "
            "bf16=True with float32, or bf16=False with bfloat16, is refused."
        },
    )


@dataclass(frozen=True)
class Precision:
    """Where a run uses bf16, and why."""

    sampling_bf16: bool
    """The in-process generators sample from a bf16 copy of the weights (else from the
    weights as they are)."""
    training_bf16: bool
    """Training runs under bf16 autocast (transformers' ``bf16``)."""
    reason: str
    """Why, in words (the probe's times when it ran)."""
    probe: Any = None
    """The :class:`~trainers.grpo.precision.ProbeTimes` the choice came from (None: no probe)."""

    def describe(self) -> str:
        """One line: the choice and why."""
        sampling = "bfloat16" if self.sampling_bf16 else "float32"
        training = "bf16 autocast" if self.training_bf16 else "float32"
        return f"sampling {sampling}, training {training}: {self.reason}"

    def metrics(self) -> dict[str, float]:
        """The choice (1: bf16) and the probe's times as step-log values (``precision/...``)."""
        chosen = {
            "precision/sampling_bf16": float(self.sampling_bf16),
            "precision/training_bf16": float(self.training_bf16),
        }
        return {**chosen, **(self.probe.metrics() if self.probe is not None else {})}

    def as_json(self) -> dict[str, Any]:
        """The record as plain values (``summary.json``'s ``precision``)."""
        return {
            "sampling": "bfloat16" if self.sampling_bf16 else "float32",
            "training": "bfloat16" if self.training_bf16 else "float32",
            "reason": self.reason,
            "probe": None if self.probe is None else self.probe.as_json(),
        }


def gpu_support() -> tuple[bool, bool]:
    """Whether torch sees a CUDA GPU, and whether it supports bf16."""
    import torch

    gpu = torch.cuda.is_available()
    return gpu, gpu and torch.cuda.is_bf16_supported()


def check_dtype(config: Any, refuse: Any) -> None:
    """``dtype``: one of :data:`DTYPES`, and no contradiction with an explicit ``bf16`` or
    with ``fp16``."""
    dtype = config.dtype
    if not isinstance(dtype, str) or dtype not in DTYPES:
        hint = did_you_mean(dtype, DTYPES) if isinstance(dtype, str) else ""
        raise InvalidArgumentError(
            f"dtype must be one of {list(DTYPES)}, actual value: {dtype!r:.80}.{hint}"
        )
    if dtype == "float32" and config.bf16 is True:
        refuse("bf16", True, "None or False with dtype='float32' (or set dtype='bfloat16')")
    if dtype == "bfloat16" and config.bf16 is False:
        refuse("bf16", False, "None or True with dtype='bfloat16' (or set dtype='float32')")
    if dtype == "bfloat16" and config.fp16:
        refuse("fp16", True, "False with dtype='bfloat16' (one mixed precision at a time)")


def static_precision(config: Any, gpu: bool, gpu_bf16: bool) -> Precision | None:
    """The precision ``config`` fixes without measuring (see the module's table), or None
    when the probe decides (``"auto"``, ``bf16`` None, no fp16, on a CPU). ``gpu``: the run
    trains on a GPU; ``gpu_bf16``: one that supports bf16."""
    if config.dtype == "float32":
        return Precision(False, False, "dtype='float32' (no probe)")
    if config.dtype == "bfloat16":
        return Precision(True, True, "dtype='bfloat16' (no probe)")
    if config.fp16:
        return Precision(False, False, "auto with fp16=True: fp16 mixed precision, no bf16")
    if config.bf16 is not None:
        on = bool(config.bf16)
        return Precision(
            False,
            on,
            f"auto with bf16={on} set (no probe): sampling from the weights as they are "
            "(dtype='bfloat16' samples from a bf16 copy)",
        )
    if gpu:
        if gpu_bf16:
            return Precision(
                False,
                True,
                "auto on a GPU that supports bf16: bf16 autocast training (transformers' rule); "
                "sampling from the trainer's weights (dtype='bfloat16' samples from a bf16 copy)",
            )
        return Precision(False, False, "auto on a GPU without bf16")
    return None
