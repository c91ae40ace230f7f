"""The teacher of on-policy distillation: next-token logprobs of the student's own samples.

A :class:`Teacher` scores token sequences: for ``(token_ids, start)`` it returns
``log p_teacher(token_ids[k] | token_ids[:k])`` for every ``k`` in ``range(start, len(token_ids))``.
Two implementations: :class:`HFTeacher` (a local ``transformers`` model) and
:class:`EndpointTeacher` (an OpenAI-compatible server that returns prompt logprobs: vLLM, or
``llm-gym serve``). :func:`teacher_from_config` builds either from a config value.

The learning signal (Thinking Machines' on-policy distillation, tinker-cookbook with discount 0)
is the negative per-token reverse KL on the sampled tokens, :func:`reverse_kl_advantages`. Shapes:
``B`` sequences, ``C`` completion tokens. The tokenizer must be the student's: a token id the
teacher's vocabulary lacks is refused, any other mismatch is the caller's to avoid.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from llm_gym.errors import InvalidArgumentError
from trainers.distillation.endpoint import (
    LOGPROB_FLOOR,
    LOGPROB_TOLERANCE,
    EndpointTeacher,
    check_sequences,
    parse_prompt_logprobs,
)

__all__ = [
    "Teacher",
    "HFTeacher",
    "EndpointTeacher",
    "teacher_from_config",
    "parse_prompt_logprobs",
    "reverse_kl_advantages",
    "mean_reverse_kl",
    "LOGPROB_FLOOR",
    "LOGPROB_TOLERANCE",
]


@runtime_checkable
class Teacher(Protocol):
    """Anything that scores token sequences with next-token logprobs (see the module docstring)."""

    def logprobs(self, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
        """For each ``(token_ids, start)``: ``len(token_ids) - start`` logprobs, in order."""
        ...


class HFTeacher:
    """A local ``transformers`` causal LM as the teacher (eval mode, no gradients).

    Args:
        model_or_path: A model directory or hub id (loaded with
            ``AutoModelForCausalLM.from_pretrained``), or a loaded model.
        device: Where to run it (default: a loaded model stays where it is; a loaded path goes
            to CUDA when available, else CPU).
        dtype: The torch dtype (or its name) to load or cast the weights to (default: as saved).
        batch_size: Sequences per forward pass; they are right-padded to the longest one.
        trust_remote_code: Passed to ``from_pretrained``.
    """

    def __init__(
        self,
        model_or_path: Any,
        *,
        device: Any = None,
        dtype: Any = None,
        batch_size: int = 8,
        trust_remote_code: bool = False,
    ) -> None:
        import torch

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(
                f"batch_size must be an int >= 1, actual value: {batch_size!r}."
            )
        if isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise InvalidArgumentError(
                    f"dtype must name a torch dtype, actual value: {dtype!r}."
                )
            dtype = getattr(torch, dtype)
        if isinstance(model_or_path, str | os.PathLike):
            from transformers import AutoModelForCausalLM

            kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
            if dtype is not None:
                kwargs["dtype"] = dtype
            from llm_gym.policies.pretrained import resolve_model_path

            model_or_path = resolve_model_path(model_or_path)
            model = AutoModelForCausalLM.from_pretrained(model_or_path, **kwargs)
            if device is None:
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.name = str(model_or_path)
        else:
            model = model_or_path
            self.name = (
                getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
            )
        if device is not None or dtype is not None:
            model = model.to(device=device, dtype=dtype)
        self.model = model.eval()
        self.batch_size = batch_size
        embeddings = model.get_output_embeddings()
        weight = getattr(embeddings, "weight", None)
        self.vocab_size = (
            int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)
        )
        self.max_length: int | None = getattr(model.config, "max_position_embeddings", None)

    def __repr__(self) -> str:
        return f"HFTeacher({self.name!r}, batch_size={self.batch_size})"

    def logprobs(self, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
        check_sequences(sequences, self.vocab_size)
        for i, (ids, _) in enumerate(sequences):
            if self.max_length is not None and len(ids) > self.max_length:
                raise InvalidArgumentError(
                    f"sequences[{i}] has {len(ids)} tokens; the teacher's context is "
                    f"{self.max_length} (max_position_embeddings)."
                )
        # Similar lengths share a batch (less padding); answers go back in the caller's order.
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
        out: list[list[float]] = [[] for _ in sequences]
        for first in range(0, len(order), self.batch_size):
            chunk = order[first : first + self.batch_size]
            for i, values in zip(chunk, self._score([sequences[i] for i in chunk]), strict=True):
                out[i] = values
        return out

    def _score(self, batch: list[tuple[Sequence[int], int]]) -> list[list[float]]:
        import torch

        device = next(self.model.parameters()).device
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.zeros((len(batch), width), dtype=torch.long)  # right-padded
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
            mask[row, : len(ids)] = 1
        with torch.inference_mode():  # right padding: positions are 0.. as unpadded
            logits = self.model(
                input_ids=input_ids.to(device), attention_mask=mask.to(device), use_cache=False
            ).logits
            out = []
            for row, (ids, start) in enumerate(batch):
                # Logits at k-1 predict token k; float32 before the softmax, whatever the dtype.
                row_logps = torch.log_softmax(logits[row, start - 1 : len(ids) - 1].float(), -1)
                targets = input_ids[row, start : len(ids)].to(device)
                out.append(row_logps.gather(-1, targets[:, None])[:, 0].tolist())
        return out


LOCAL_TEACHER_KEYS = ("model", "device", "dtype", "batch_size", "trust_remote_code")
ENDPOINT_TEACHER_KEYS = ("model", "base_url", "api_key", "timeout_s", "max_concurrency")


def teacher_from_config(spec: Any) -> Teacher:
    """Build a teacher from a config value.

    * a ``str`` (or path): a model directory or hub id, loaded as an :class:`HFTeacher`;
    * a mapping with ``base_url``: an :class:`EndpointTeacher` (keys: ``model``, ``base_url``,
      ``api_key``, ``timeout_s``, ``max_concurrency``);
    * a mapping without it: an :class:`HFTeacher` (keys: ``model``, ``device``, ``dtype``,
      ``batch_size``, ``trust_remote_code``);
    * a :class:`Teacher` already built is returned as is.
    """
    if isinstance(spec, str | os.PathLike):
        return HFTeacher(spec)
    if isinstance(spec, Mapping):
        endpoint = "base_url" in spec
        allowed = ENDPOINT_TEACHER_KEYS if endpoint else LOCAL_TEACHER_KEYS
        unknown = sorted(str(k) for k in spec if k not in allowed)
        if unknown:
            kind = "an endpoint teacher (base_url given)" if endpoint else "a local teacher"
            raise InvalidArgumentError(
                f"Unknown teacher key(s) {unknown} for {kind}; allowed keys: {list(allowed)}"
                + ("" if endpoint else " (add base_url for an OpenAI-compatible endpoint).")
            )
        kwargs = {k: v for k, v in spec.items() if k != "model"}
        if not spec.get("model"):
            raise InvalidArgumentError(
                f"The teacher config needs 'model', actual value: {dict(spec)!r}."
            )
        if endpoint:
            return EndpointTeacher(model=spec["model"], **kwargs)
        return HFTeacher(spec["model"], **kwargs)
    if isinstance(spec, Teacher):
        return spec
    raise InvalidArgumentError(
        "Expected a teacher model path, a mapping {'model': ..., 'base_url': ...} or a Teacher, "
        f"actual value: {spec!r}."
    )


def _check_shapes(student_logps: Any, teacher_logps: Any, mask: Any) -> None:
    shapes = {tuple(t.shape) for t in (student_logps, teacher_logps, mask)}
    if len(shapes) != 1:
        raise InvalidArgumentError(
            "student_logps, teacher_logps and mask must have one shape (B, C), actual shapes: "
            f"{tuple(student_logps.shape)}, {tuple(teacher_logps.shape)}, {tuple(mask.shape)}."
        )


def reverse_kl_advantages(
    student_logps: Any, teacher_logps: Any, mask: Any, kl_coef: float = 1.0
) -> Any:
    """Per-token advantages ``kl_coef * (teacher_logps - student_logps) * mask``, shape (B, C).

    ``student_logps - teacher_logps`` on the sampled token is the one-sample estimate of the
    reverse KL ``KL(student || teacher)``; its negative, unreduced over time (discount 0), is each
    token's advantage. ``mask`` is 1 on policy tokens, 0 on env/tool tokens and padding. The
    result is detached: advantages are constants of the policy-gradient loss.

    Example:
        >>> import torch
        >>> s, t = torch.tensor([[-1.0, -3.0]]), torch.tensor([[-0.5, -2.0]])
        >>> reverse_kl_advantages(s, t, torch.tensor([[1, 0]]), kl_coef=2.0)
        tensor([[1., 0.]])
    """
    _check_shapes(student_logps, teacher_logps, mask)
    student_logps, teacher_logps = student_logps.detach(), teacher_logps.detach()
    return kl_coef * (teacher_logps - student_logps) * mask.to(student_logps.dtype)


def mean_reverse_kl(student_logps: Any, teacher_logps: Any, mask: Any) -> float:
    """The masked mean of ``student_logps - teacher_logps`` (0.0 when the mask is empty).

    Example:
        >>> import torch
        >>> s, t = torch.tensor([[-1.0, -2.0, -4.0]]), torch.tensor([[-0.5, -3.0, -1.0]])
        >>> mean_reverse_kl(s, t, torch.tensor([[1, 1, 0]]))
        0.25
    """
    _check_shapes(student_logps, teacher_logps, mask)
    weights = mask.detach().to(student_logps.dtype)
    total = float(weights.sum())
    if total == 0:
        return 0.0
    return float(((student_logps - teacher_logps).detach() * weights).sum()) / total
