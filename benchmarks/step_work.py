"""The work of a model's step, counted from its shape: FLOPs done and bytes moved.

Pure functions over a :class:`ModelShape` (the attention's own FLOPs and the activations' bytes
are left out, so each count is a lower bound of the step's work; :mod:`benchmarks.roofline`
turns a count into the least time the hardware allows):

* a decode step of R rows (:func:`decode_step`): ``2 x params x R`` FLOPs; the weights read once
  (``params x bytes per parameter``) plus the key/value cache columns the rows read;
* a prefill of T tokens (:func:`prefill`): ``2 x params x T`` FLOPs; the weights once, the
  context's keys and values read and the T tokens' written;
* a whole generation (:func:`generation`: shared prefix once, each row's own prompt, then decode
  steps) and a recorded set of token streams (:func:`stream_work`);
* a training step over N tokens (:func:`train_step`): forward and backward, ``6 x params x N``
  FLOPs; the weights read by the forward and by the backward and their gradients written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.errors import InvalidArgumentError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes an element of each dtype takes."""


def require_positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Raise :class:`InvalidArgumentError` unless ``value`` > 0 (>= 0 with ``allow_zero``)."""
    if value < 0 or (value == 0 and not allow_zero):
        least = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"Expected {name} {least}, got {value!r}: pass a count or rate.")


def element_bytes(dtype: str) -> int:
    """Bytes an element of ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``) takes."""
    if dtype not in DTYPE_BYTES:
        raise InvalidArgumentError(
            f"Expected a dtype among {sorted(DTYPE_BYTES)}, got {dtype!r}: pass the name torch "
            "prints without 'torch.' (e.g. 'float32')."
        )
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a decoder-only transformer."""

    parameters: int
    """Parameters (each read once per forward pass)."""
    layers: int
    """Decoder layers."""
    hidden: int
    """Hidden size."""
    intermediate: int
    """The MLP's inner size."""
    kv_heads: int
    """Key/value heads (grouped-query attention: fewer than the query heads)."""
    head_dim: int
    """Size of one head."""
    vocab: int
    """Vocabulary size."""

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a transformers causal LM (its config and parameter count)."""
        config = model.config
        heads = config.num_attention_heads
        return cls(
            parameters=sum(p.numel() for p in model.parameters()),
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
        )

    def kv_bytes_per_token(self, element: int) -> int:
        """Bytes of one token's keys and values over all layers, ``element`` bytes each."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element


@dataclass(frozen=True)
class Work:
    """FLOPs done and bytes moved to or from memory; works add up."""

    flops: float
    bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, factor: float) -> Work:
        """This work ``factor`` times."""
        return Work(self.flops * factor, self.bytes * factor)


def decode_step(shape: ModelShape, rows: int, context_tokens: int, element: int) -> Work:
    """One decode step of ``rows`` rows: ``2 x params x rows`` FLOPs; the weights read once
    (``element`` bytes a parameter) and the ``context_tokens`` key/value columns the rows read
    (all rows together; a shared prefix counted once).

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)  # 2 x 2 x 1 x 4 = 16 elements a token
        >>> decode_step(shape, rows=4, context_tokens=10, element=4)
        Work(flops=8000, bytes=4640)
    """
    require_positive("rows", rows)
    require_positive("context_tokens", context_tokens, allow_zero=True)
    kv = shape.kv_bytes_per_token(element)
    return Work(2 * shape.parameters * rows, shape.parameters * element + kv * context_tokens)


def prefill(shape: ModelShape, tokens: int, element: int, context_tokens: int = 0) -> Work:
    """One pass over ``tokens`` new tokens after ``context_tokens`` cached ones:
    ``2 x params x tokens`` FLOPs; the weights read once, the context's keys and values read
    and the new tokens' written.

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)
        >>> prefill(shape, tokens=6, element=2, context_tokens=4)
        Work(flops=12000, bytes=2320)
    """
    require_positive("tokens", tokens)
    require_positive("context_tokens", context_tokens, allow_zero=True)
    kv = shape.kv_bytes_per_token(element)
    return Work(
        2 * shape.parameters * tokens, shape.parameters * element + kv * (context_tokens + tokens)
    )


def generation(
    shape: ModelShape, prompts: Sequence[int], shared: int, new_tokens: int, element: int
) -> Work:
    """``new_tokens`` sampled for each of ``len(prompts)`` rows whose prompts (``prompts``:
    their lengths) share their first ``shared`` tokens: the prefix prefilled once, the rows' own
    prompt tokens in one pass reading it, then ``new_tokens - 1`` decode steps of every row (the
    first token comes from the prefill's logits), step ``t`` reading the prefix once, every row's
    prompt and its ``t + 1`` sampled tokens (the last of them, the one it feeds, written).

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)  # 64 bytes a token at element=4
        >>> w = generation(shape, prompts=[5, 7], shared=3, new_tokens=3, element=4)
        >>> w.flops == 2 * 1000 * (3 + 6 + 2 * 2)  # prefix, own prompt tokens, 2 steps x 2 rows
        True
        >>> w.bytes == 4 * 4000 + 64 * (3 + (3 + 6) + (9 + 2) + (9 + 4))
        True
    """
    require_positive("new_tokens", new_tokens)
    if not prompts or shared > min(prompts):
        raise InvalidArgumentError(
            f"Expected at least one prompt, each at least as long as the shared prefix "
            f"({shared}), got lengths {list(prompts)}: pass the prompts' lengths."
        )
    rows, own = len(prompts), sum(prompts) - len(prompts) * shared
    work = Work(0, 0)
    if shared:
        work += prefill(shape, shared, element)
    if own:
        work += prefill(shape, own, element, context_tokens=shared)
    for step in range(new_tokens - 1):
        work += decode_step(shape, rows, shared + own + rows * (step + 1), element)
    return work


def stream_work(shape: ModelShape, prefix: int, streams: Iterable[Any], element: int) -> Work:
    """The work of recorded token streams (:class:`benchmarks.rollout_replay.Stream`: ``ops``,
    each ``ids`` fed at ``column`` of its row after ``prefix_len`` shared tokens, one sampled
    token each) decoded in the fewest passes their order allows: the ``prefix`` shared tokens
    prefilled once, then pass ``k`` feeds every stream's ``k``-th op; FLOPs for every token fed,
    and per pass the weights once, the shared prefix once and each op's own columns."""
    ops_by_pass: list[list[Any]] = []
    for stream in streams:
        for k, op in enumerate(stream.ops):
            if k == len(ops_by_pass):
                ops_by_pass.append([])
            ops_by_pass[k].append(op)
    work = prefill(shape, prefix, element) if prefix else Work(0, 0)
    kv = shape.kv_bytes_per_token(element)
    for ops in ops_by_pass:
        fed = sum(len(op.ids) for op in ops)
        columns = max(op.prefix_len for op in ops) + sum(op.column + len(op.ids) for op in ops)
        work += Work(2 * shape.parameters * fed, shape.parameters * element + kv * columns)
    return work


def train_step(shape: ModelShape, tokens: int, element: int) -> Work:
    """Forward and backward over ``tokens`` tokens: ``6 x params x tokens`` FLOPs (2 forward, 4
    backward); the weights read by the forward and the backward and their gradients written
    (``3 x params x element`` bytes; activations and the optimizer's state left out). No
    tokens, no pass: no work.

    Example:
        >>> train_step(ModelShape(1000, 2, 8, 16, 1, 4, 50), tokens=10, element=4)
        Work(flops=60000, bytes=12000)
    """
    require_positive("tokens", tokens, allow_zero=True)
    if tokens == 0:
        return Work(0, 0)
    return Work(6 * shape.parameters * tokens, 3 * shape.parameters * element)


def dtype_of(model: Any) -> str:
    """The dtype of a model's parameters, as :data:`DTYPE_BYTES` names it (``"float32"``)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")
