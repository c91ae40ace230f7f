"""bf16 where the hardware has it: the start-up probe, the choice, and the sampler's bf16 copy.

``dtype="auto"`` on a CPU (:mod:`trainers.grpo.config.dtype`) is decided here, when the trainer
knows its model: :func:`probe_matmuls` times one matmul at the model's decode shape (32 rows
through the MLP's up projection) and one at a training shape (256 tokens through it), each in
fp32 and in bf16, best of a few runs on one thread (0.1 to 0.3 s on a CPU without bf16
hardware; less with it). :func:`bf16_pays` decides each use on those times with a margin:
bf16 for sampling when it is :data:`BF16_MARGIN` times faster at the decode shape, bf16 autocast
for training when it is at the training shape. CPUs with AMX or AVX-512 BF16 run bf16 matmuls
several times faster than fp32; others convert and run them slower, and keep fp32.

A sampler in bf16 samples from a bf16 copy of the trainer's weights: :class:`SamplingCopy` in
lockstep (its parameters copied from the trainer's, cast, before every collection), the async
generator replicas' own copies (:func:`generator_copy`; each published version is cast as it is
staged).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainers.grpo.config.dtype import Precision

__all__ = [
    "BF16_MARGIN",
    "ProbeTimes",
    "SamplingCopy",
    "bf16_pays",
    "choose_precision",
    "cpu_bf16_flags",
    "generator_copy",
    "model_shapes",
    "probe_matmuls",
    "settle_precision",
]

LOG = logging.getLogger(__name__)

BF16_MARGIN = 1.25
"""bf16 is chosen where its matmul takes at most 1 / this of fp32's time: a smaller gain does
not pay for the sampler's logprob gap (and the extra scoring pass that measures it)."""
DECODE_ROWS = 32
"""Rows of the probe's decode matmul (episodes decoding at once)."""
TRAIN_TOKENS = 256
"""Rows of the probe's training matmul (tokens of a micro-batch, a slice of them)."""
MIN_WIDTH, MAX_WIDTH = 512, 2048
"""The probe's matmul widths are the model's, within these: narrower, a matmul times call
overhead rather than the hardware; wider, the probe would take seconds."""
REPEATS = 10
"""Most timed runs of each matmul after a warm-up (the best counts)."""
CELL_BUDGET_S = 0.05
"""A matmul's timed runs stop once they took this long together (at least two run)."""
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""The CPU flags of bf16 matmul hardware (Linux's /proc/cpuinfo names)."""


def bf16_pays(fp32_s: float, bf16_s: float, margin: float = BF16_MARGIN) -> bool:
    """Whether bf16 is worth it on these times of the same matmul: bf16 at least ``margin``
    times faster (both times finite and positive; otherwise fp32).

    Example:
        >>> bf16_pays(0.010, 0.004), bf16_pays(0.010, 0.009), bf16_pays(0.010, 0.008)
        (True, False, True)
    """
    times = (fp32_s, bf16_s)
    if not all(math.isfinite(t) and t > 0 for t in times):
        return False
    return fp32_s >= margin * bf16_s


@dataclass(frozen=True)
class ProbeTimes:
    """What the start-up probe measured: seconds of one matmul, best of its runs."""

    decode_shape: tuple[int, int, int]
    """(rows, in, out) of the decode matmul."""
    train_shape: tuple[int, int, int]
    """(rows, in, out) of the training matmul."""
    decode_fp32_s: float
    decode_bf16_s: float
    train_fp32_s: float
    train_bf16_s: float
    threads: int
    """Torch threads the probe ran with (one)."""
    cpu_flags: tuple[str, ...] = ()
    """The :data:`BF16_FLAGS` the CPU lists."""

    def as_json(self) -> dict[str, Any]:
        """Plain values (milliseconds and GFLOP/s), for ``summary.json``."""

        def rate(shape: tuple[int, int, int], seconds: float) -> float:
            return 2 * math.prod(shape) / seconds / 1e9

        out: dict[str, Any] = {"threads": self.threads, "cpu_bf16_flags": list(self.cpu_flags)}
        for name, shape in (("decode", self.decode_shape), ("train", self.train_shape)):
            out[f"{name}_shape"] = list(shape)
            for dtype in ("fp32", "bf16"):
                seconds = getattr(self, f"{name}_{dtype}_s")
                out[f"{name}_{dtype}_ms"] = round(seconds * 1e3, 4)
                out[f"{name}_{dtype}_gflops"] = round(rate(shape, seconds), 2)
        return out

    def metrics(self) -> dict[str, float]:
        """The times as step-log values (``precision/...``, milliseconds)."""
        return {
            f"precision/probe_{name}_{dtype}_ms": getattr(self, f"{name}_{dtype}_s") * 1e3
            for name in ("decode", "train")
            for dtype in ("fp32", "bf16")
        }


def cpu_bf16_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The :data:`BF16_FLAGS` in ``cpuinfo`` (None: ``/proc/cpuinfo``; empty where it is not
    readable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return ()
    words = set(cpuinfo.split())
    return tuple(flag for flag in BF16_FLAGS if flag in words)


def model_shapes(model_config: Any) -> tuple[int, int]:
    """(hidden size, MLP width) of a transformers config (a multimodal one's text model);
    the MLP width is 4 x hidden where the config names none."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else None
    text = text or model_config
    hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None) or MIN_WIDTH
    width = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None)
    return int(hidden), int(width or 4 * hidden)


def _time(x: Any, weight: Any) -> float:
    import torch

    with torch.no_grad():
        torch.nn.functional.linear(x, weight)  # warm-up: the kernel's first call
        best, spent = math.inf, 0.0
        for run in range(REPEATS):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            took = time.perf_counter() - start
            best, spent = min(best, took), spent + took
            if run >= 1 and spent >= CELL_BUDGET_S:
                break
    return best


def probe_matmuls(hidden: int, width: int) -> ProbeTimes:
    """Time one matmul at the decode shape and one at the training shape, in fp32 and bf16
    (widths within [:data:`MIN_WIDTH`, :data:`MAX_WIDTH`]), on one torch thread: the ratio is
    the core's, and a parallel matmul on a shared machine would time the scheduler (a thread
    waiting for a sibling that another process holds) rather than the arithmetic."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _probe(hidden, width)
    finally:
        torch.set_num_threads(threads)


def _probe(hidden: int, width: int) -> ProbeTimes:
    import torch

    def clamp(n: int) -> int:
        return max(MIN_WIDTH, min(MAX_WIDTH, int(n)))

    k, n = clamp(hidden), clamp(width)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(n, k, generator=generator)
    times: dict[str, float] = {}
    for name, rows in (("decode", DECODE_ROWS), ("train", TRAIN_TOKENS)):
        x = torch.randn(rows, k, generator=generator)
        times[f"{name}_fp32_s"] = _time(x, weight)
        times[f"{name}_bf16_s"] = _time(x.bfloat16(), weight.bfloat16())
    return ProbeTimes(
        decode_shape=(DECODE_ROWS, k, n),
        train_shape=(TRAIN_TOKENS, k, n),
        threads=torch.get_num_threads(),
        cpu_flags=cpu_bf16_flags(),
        **times,
    )


def choose_precision(probe: ProbeTimes, margin: float = BF16_MARGIN) -> Precision:
    """``dtype="auto"``'s choice on a CPU from the probe's times: each use in bf16 where
    :func:`bf16_pays`, with the reason in words."""
    sampling = bf16_pays(probe.decode_fp32_s, probe.decode_bf16_s, margin)
    training = bf16_pays(probe.train_fp32_s, probe.train_bf16_s, margin)
    flags = ", ".join(probe.cpu_flags) or f"none of {', '.join(BF16_FLAGS)}"

    def said(name: str, shape: tuple[int, int, int], fp32: float, bf16: float, on: bool) -> str:
        verdict = "bf16" if on else "fp32"
        return (f"{name} {'x'.join(map(str, shape))}: fp32 {fp32 * 1e3:.3f} ms, bf16 "
                f"{bf16 * 1e3:.3f} ms ({fp32 / bf16:.2f}x) -> {verdict}")  # fmt: skip

    threads = f"{probe.threads} thread{'s' * (probe.threads != 1)}"
    reason = (
        f"auto on a CPU (bf16 flags: {flags}; {threads}; bf16 needs {margin:g}x): "
        + said("decode", probe.decode_shape, probe.decode_fp32_s, probe.decode_bf16_s, sampling)
        + "; "
        + said("training", probe.train_shape, probe.train_fp32_s, probe.train_bf16_s, training)
    )
    return Precision(sampling, training, reason, probe)


def settle_precision(args: Any, model: Any) -> Precision:
    """The run's precision, logged once: the config's (``args.precision``), or, where the probe
    decides, :func:`choose_precision` on the model's shapes (``model``: a model or its path),
    the same on every process (the first's). The training half becomes ``args.bf16`` and
    accelerate's mixed precision. The sampling half holds for in-process generators of a whole
    model: vLLM samples in its own dtype, and a sharded model (FSDP, DeepSpeed) has no whole
    copy to cast, so those sample as they do without bf16."""
    precision = args.precision
    if precision is None:
        precision = choose_precision(probe_matmuls(*model_shapes(_model_config(model))))
        precision = _from_first_process(precision)
        args.bf16 = precision.training_bf16
        if precision.training_bf16:
            args.mixed_precision = "bf16"
    if precision.sampling_bf16 and (args.use_vllm or _sharded(args)):
        why = (
            "vLLM samples in its own dtype"
            if args.use_vllm
            else "a sharded model (FSDP, DeepSpeed) samples in its weights' dtype"
        )
        precision = replace(precision, sampling_bf16=False, reason=f"{precision.reason}; {why}")
    args.precision = precision
    LOG.info("precision: %s", precision.describe())
    return precision


def _sharded(args: Any) -> bool:
    import os

    return bool(args.fsdp or args.deepspeed) or any(
        os.environ.get(f"ACCELERATE_USE_{name}", "").lower() in ("1", "true")
        for name in ("FSDP", "DEEPSPEED")
    )


def _model_config(model: Any) -> Any:
    if isinstance(model, str | Path):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(model))
    return model.config


def _from_first_process(precision: Precision) -> Precision:
    """Every process takes the first process's choice (one mixed precision per run)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return precision
    box = [precision]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def generator_copy(model: Any, *, bf16: bool = False) -> Any:
    """A generator's own copy of the trainer's model: frozen, in eval mode, its parameters in
    bf16 when ``bf16`` (buffers, rotary frequencies among them, keep their dtype).

    Accelerate wraps a prepared model's ``forward`` in an instance attribute (mixed precision's
    output cast) whose closure holds the *original* model; a deep copy keeps that closure, so
    the copy would run the trainer's weights. The copy drops the wrapper and runs its class's
    ``forward`` (in the weights' own dtype).
    """
    import torch

    clone = copy.deepcopy(model)
    for name in ("forward", "_original_forward"):
        clone.__dict__.pop(name, None)
    clone.eval().requires_grad_(False)
    for param in clone.parameters():
        param.grad = None
        if bf16 and param.is_floating_point():
            param.data = param.data.to(torch.bfloat16)
    return clone


class SamplingCopy:
    """Lockstep's bf16 sampler: a copy of the trainer's model in bf16, built at the first
    collection; :meth:`of` copies the trainer's current parameters into it (cast) and returns
    it, so it samples with the weights of the moment."""

    def __init__(self) -> None:
        self.model: Any = None
        """The bf16 copy (None until the first collection)."""
        self.refresh_seconds = 0.0
        """Seconds spent copying weights into it, over the run."""

    def of(self, source: Any) -> Any:
        """The copy, holding ``source``'s current parameters."""
        start = time.perf_counter()
        if self.model is None:
            self.model = generator_copy(source, bf16=True)
        else:
            import torch

            targets = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, param in source.named_parameters():
                    targets[name].copy_(param)
        self.refresh_seconds += time.perf_counter() - start
        return self.model
