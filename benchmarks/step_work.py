"""The work of a model's step, counted from its shape: FLOPs done and bytes moved.

Pure functions over a :class:`ModelShape` (the attention's own FLOPs and the activations' bytes
are left out; ``params`` below are the matrices a position multiplies by, the body and the output
head, an untied input embedding table being a lookup; :mod:`benchmarks.roofline` turns a count
into the least time the hardware allows):

* a decode step of R rows (:func:`decode_step`): ``2 x params x R`` FLOPs; the weights read once
  (``params x bytes per parameter``) plus the key/value cache columns the rows read;
* a prefill of T tokens (:func:`prefill`): ``2 x body params x T`` FLOPs and the head's only
  for the positions whose logits are sampled from; the weights once, the context's keys and
  values read and the T tokens' written;
* a whole generation (:func:`generation`: shared prefix once, each row's own prompt, then decode
  steps) and a recorded set of token streams (:func:`stream_work`);
* a training step (:func:`train_step`): forward and backward over the batch's distinct
  positions (:func:`prefix_tree_work`: rows that share a prefix need it once), ``6 x body
  params`` FLOPs a position, and through the output head only where the loss reads logits
  (``6 x vocab x hidden`` a trained position); the weights read by the forward and by the
  backward and their gradients written; the positions of a trainer's batch (TRL's layout) and
  the tokens it trains (:func:`batch_work`).
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
    untied_embedding: int = 0
    """The input embedding table's parameters where it is not the output head's matrix (0
    where the model ties them): a lookup, no FLOPs."""

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a transformers causal LM (its config and parameter count)."""
        config = model.config
        heads = config.num_attention_heads
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = head is not None and head.weight.data_ptr() == embedding.weight.data_ptr()
        return cls(
            parameters=sum(p.numel() for p in model.parameters()),
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            untied_embedding=0 if tied else embedding.weight.numel(),
        )

    @property
    def head_parameters(self) -> int:
        """The output head's parameters (``vocab x hidden``): the FLOPs of a position's logits
        are twice this."""
        return self.vocab * self.hidden

    @property
    def body_parameters(self) -> int:
        """The parameters a position's hidden state passes through: all but the output head
        and an untied input embedding table (a lookup)."""
        return self.parameters - self.head_parameters - self.untied_embedding

    @property
    def matmul_parameters(self) -> int:
        """The parameters a position with logits multiplies by: the body and the head."""
        return self.body_parameters + self.head_parameters

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
    flops = 2 * shape.matmul_parameters * rows
    return Work(flops, shape.parameters * element + kv * context_tokens)


def prefill(
    shape: ModelShape, tokens: int, element: int, context_tokens: int = 0, logits: int = 0
) -> Work:
    """One pass over ``tokens`` new tokens after ``context_tokens`` cached ones, ``logits`` of
    them sampled from: ``2 x body params x tokens + 2 x head params x logits`` FLOPs; the
    weights read once, the context's keys and values read and the new tokens' written.

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)  # head 50 x 8 = 400, body 600
        >>> prefill(shape, tokens=6, element=2, context_tokens=4, logits=1)
        Work(flops=8000, bytes=2320)
    """
    require_positive("tokens", tokens)
    require_positive("context_tokens", context_tokens, allow_zero=True)
    if not 0 <= logits <= tokens:
        raise InvalidArgumentError(
            f"Expected 0 <= logits <= tokens ({tokens}), got logits={logits!r}: the positions "
            "sampled from are some of the new ones."
        )
    kv = shape.kv_bytes_per_token(element)
    return Work(
        2 * (shape.body_parameters * tokens + shape.head_parameters * logits),
        shape.parameters * element + kv * (context_tokens + tokens),
    )


def generation(
    shape: ModelShape, prompts: Sequence[int], shared: int, new_tokens: int, element: int
) -> Work:
    """``new_tokens`` sampled for each of ``len(prompts)`` rows whose prompts (``prompts``:
    their lengths) share their first ``shared`` tokens: the prefix prefilled once, the rows' own
    prompt tokens in one pass reading it (logits at each row's last prompt token), then
    ``new_tokens - 1`` decode steps of every row (the first token comes from the prefill's
    logits), step ``t`` reading the prefix once, every row's prompt and its ``t + 1`` sampled
    tokens (the last of them, the one it feeds, written).

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)  # 64 bytes a token at element=4
        >>> w = generation(shape, prompts=[5, 7], shared=3, new_tokens=3, element=4)
        >>> w.flops == 2 * (600 * (3 + 6) + 400 * 2) + 2 * 1000 * 2 * 2  # prefill, 2 steps x 2 rows
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
    if shared:  # every row's first token from the prefix's last logits when it is all they hold
        work += prefill(shape, shared, element, logits=0 if own else 1)
    if own:
        work += prefill(shape, own, element, context_tokens=shared, logits=rows)
    for step in range(new_tokens - 1):
        work += decode_step(shape, rows, shared + own + rows * (step + 1), element)
    return work


def stream_work(shape: ModelShape, prefix: int, streams: Iterable[Any], element: int) -> Work:
    """The work of recorded token streams (:class:`benchmarks.rollout_replay.Stream`: ``ops``,
    each ``ids`` fed at ``column`` of its row after ``prefix_len`` shared tokens, one sampled
    token each) decoded in the fewest passes their order allows: the ``prefix`` shared tokens
    prefilled once, then pass ``k`` feeds every stream's ``k``-th op; the body's FLOPs for every
    token fed and the head's for each op's one sampled position, and per pass the weights once,
    the shared prefix once and each op's own columns."""
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
        flops = 2 * (shape.body_parameters * fed + shape.head_parameters * len(ops))
        work += Work(flops, shape.parameters * element + kv * columns)
    return work


def prefix_tree_work(rows: Iterable[tuple[Sequence[int], Sequence[int]]]) -> tuple[int, int]:
    """The least positions a causal model must compute for rows of token ids that share
    prefixes, and the least positions whose logits the loss reads: ``(positions, trained)``.

    Each row is ``(ids, trained)``, ``trained[i]`` 1 where the loss scores ``ids[i]``. A
    position's hidden state depends on its prefix alone, so rows that share a prefix need it
    once: the positions are the nodes of the rows' token tree; the logits that score ``ids[i]``
    are those of the node ``ids[:i]``, counted once however many rows score a token after it.

    Example:
        >>> prefix_tree_work([([1, 2, 3], [0, 0, 1]), ([1, 2, 4], [0, 0, 1])])
        (4, 1)
        >>> prefix_tree_work([([1, 2], [0, 1]), ([5], [1])])  # a first token has no logits
        (3, 1)
    """
    root: dict[int, Any] = {}
    nodes, trained_nodes = 0, set()
    for ids, trained in rows:
        if len(ids) != len(trained):
            raise InvalidArgumentError(
                f"Expected a trained mask as long as its row, got {len(trained)} marks for "
                f"{len(ids)} ids: pass one 0/1 mark a token."
            )
        node = root
        for token, scored in zip(ids, trained, strict=True):
            if scored and node is not root:
                trained_nodes.add(id(node))
            if token not in node:
                node[token] = {}
                nodes += 1
            node = node[token]
    return nodes, len(trained_nodes)


def train_step(shape: ModelShape, tokens: int, trained: int, element: int) -> Work:
    """Forward and backward over ``tokens`` positions, ``trained`` of them with logits in the
    loss: ``6 x body params`` FLOPs a position and ``6 x head params`` a trained one (2 forward,
    4 backward); the weights read by the forward and the backward and their gradients written
    (``3 x params x element`` bytes; activations and the optimizer's state left out). No
    tokens, no pass: no work.

    Example:
        >>> shape = ModelShape(1000, 2, 8, 16, 1, 4, 50)  # head 400, body 600
        >>> train_step(shape, tokens=10, trained=4, element=4)
        Work(flops=45600, bytes=12000)
    """
    require_positive("tokens", tokens, allow_zero=True)
    if not 0 <= trained <= tokens:
        raise InvalidArgumentError(
            f"Expected 0 <= trained <= tokens ({tokens}), got trained={trained!r}: the trained "
            "positions are some of the positions."
        )
    if tokens == 0:
        return Work(0, 0)
    flops = 6 * (shape.body_parameters * tokens + shape.head_parameters * trained)
    return Work(flops, 3 * shape.parameters * element)


def batch_work(batches: list[dict[str, Any]]) -> dict[str, int]:
    """The real tokens of a step's batches (every row's prompt and completion, tool results
    included: ``tokens``), and the least work of their loss: the positions of the token tree of
    the rows up to their last trained token (``positions``) and the positions whose logits the
    loss reads (``trained``). A trained token is the model's own (``completion_mask`` and, where
    present, ``tool_mask``) with a nonzero advantage: with no KL term (beta 0, as here) a token
    of zero advantage adds nothing to the gradient, and a row of none needs no pass."""
    tokens, rows = 0, []
    for batch in batches:
        prompt_mask, completion_mask = batch["prompt_mask"].bool(), batch["completion_mask"].bool()
        trained_mask = completion_mask & (_per_token(batch["advantages"], completion_mask) != 0)
        if batch.get("tool_mask") is not None:
            trained_mask &= batch["tool_mask"].bool()
        tokens += int(prompt_mask.sum() + completion_mask.sum())
        for i in range(len(prompt_mask)):
            trained = trained_mask[i][completion_mask[i]].long().tolist()
            if not any(trained):
                continue
            last = len(trained) - trained[::-1].index(1)
            prompt = batch["prompt_ids"][i][prompt_mask[i]].tolist()
            completion = batch["completion_ids"][i][completion_mask[i]].tolist()[:last]
            rows.append((prompt + completion, [0] * len(prompt) + trained[:last]))
    positions, trained_positions = prefix_tree_work(rows)
    return {"tokens": tokens, "positions": positions, "trained": trained_positions}


def _per_token(advantages: Any, like: Any) -> Any:
    """Advantages as one per completion token: a row's one (TRL) spread over its tokens."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def dtype_of(model: Any) -> str:
    """The dtype of a model's parameters, as :data:`DTYPE_BYTES` names it (``"float32"``)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")
