"""Score a GRPO batch as the token tree of its rows: every distinct prefix runs once.

The rows of a GRPO batch share much more than the system prompt: a group's episodes share their
task's question, and episodes that open with the same tool call share that turn and the tool's
reply. TRL's loss forward runs every row from its first token; :mod:`trainers.grpo.shared_prefix`
runs the prefix all rows share once. Here each distinct prefix of any row runs once: the rows
(up to their last scored token) form a trie; its nodes past the shared prefix are packed, in
depth-first order, into a few rows of at most ``row_tokens`` tokens; each packed token attends to
the shared prefix (a KV cache, run once) and to its own ancestors (a 4D mask), at the position id
of its depth. A scored token's log-probability is read from its parent node's hidden state, and
a (node, next token) pair shared by rows is projected through the LM head once.

The forward's values are those of a per-row forward (up to float rounding), and so are the
gradients: the hidden state a row's loss reads is computed from exactly that row's tokens.

:func:`plan_token_tree` is index arithmetic on the batch (tested on hand-made batches);
:func:`score_token_tree` makes the model calls; :func:`tree_unsupported_reason` says which models
it can run (a plain LM head, attention that takes a 4D mask).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from trainers.grpo.shared_prefix import cache_keyword, output_cache
from trainers.sft.labelled_head import unsupported_reason

__all__ = [
    "TokenTreePlan",
    "plan_token_tree",
    "score_token_tree",
    "tree_costs",
    "tree_unsupported_reason",
]

HEAD_CHUNK = 32768
"""Vocabulary columns per tile of the LM head's product (TRL's chunk size)."""


@dataclass(frozen=True)
class TokenTreePlan:
    """How to score a batch as one shared prefix plus its token tree packed into rows.

    Shapes: ``B`` batch rows, ``C`` completion columns, ``L`` prefix tokens (0: no prefix pass),
    ``R`` packed rows of ``Q`` tokens, ``K`` distinct (node, next token) pairs.
    """

    prefix_ids: Any
    """(1, L): the tokens every row starts with, run once."""
    packed_ids: Any
    """(R, Q): the tree's nodes past the prefix, depth-first, right-padded with 0."""
    position_ids: Any
    """(R, Q): ``L`` + each node's depth past the prefix (padding: its column's index)."""
    attention_mask: Any
    """(R, 1, Q, L + Q) bool: the prefix, and each node's ancestors and itself."""
    logit_rows: Any
    """(K,): the packed row of the node whose hidden state predicts pair ``k``."""
    logit_columns: Any
    """(K,): that node's column."""
    targets: Any
    """(K,): the token pair ``k`` predicts."""
    gather_index: Any
    """(B, C): the pair that scores completion column ``j`` of row ``i`` (0 where unscored)."""
    scored: Any
    """(B, C) bool: the completion tokens the plan scores (real ones, of rows with any)."""
    nodes: int
    """The tree's nodes in the packed rows (their padding left out; a node in two packed rows
    counted twice)."""

    @property
    def positions(self) -> int:
        """The token positions the forward runs, padding left out: the prefix and the nodes."""
        return int(self.prefix_ids.size(1)) + self.nodes


def _row_tokens(input_ids: Any, attention_mask: Any, logits_to_keep: int):
    """Each row's real tokens (left-padded prompt, right-padded completion) and its prompt
    length, or None when a row's completion has a gap (the tree needs contiguous rows)."""
    ids = input_ids.tolist()
    mask = attention_mask.bool()
    prompt_width = input_ids.size(1) - logits_to_keep
    prompt_lengths = mask[:, :prompt_width].sum(dim=1).tolist()
    completion_lengths = mask[:, prompt_width:].sum(dim=1).tolist()
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        real = mask[i].tolist()
        if not all(real[prompt_width - prompt : prompt_width + completion]):
            return None
        if any(real[: prompt_width - prompt]) or any(real[prompt_width + completion :]):
            return None
        rows.append(ids[i][prompt_width - prompt : prompt_width + completion])
    return rows, prompt_lengths, completion_lengths


def _pack(paths: list[list[int]], capacity: int):
    """Pack trie-ordered token paths into rows of at most ``capacity`` tokens: (each row's
    tokens, each row's depths, each path's (row, columns)). A path shares with the paths
    before it in its row exactly its common prefix with the one just before."""
    packed: list[list[int]] = []
    depths: list[list[int]] = []
    placed: list[tuple[int, list[int]]] = []
    previous: tuple[list[int], list[int]] | None = None  # (tokens, columns)
    for tokens in paths:
        shared = 0
        if previous is not None:
            limit = min(len(tokens), len(previous[0]))
            while shared < limit and tokens[shared] == previous[0][shared]:
                shared += 1
        if previous is None or len(packed[-1]) + len(tokens) - shared > capacity:
            packed.append([])
            depths.append([])
            shared = 0
            previous = None
        start = len(packed[-1])
        packed[-1].extend(tokens[shared:])
        depths[-1].extend(range(shared, len(tokens)))
        columns = (previous[1][:shared] if previous else []) + list(range(start, len(packed[-1])))
        placed.append((len(packed) - 1, columns))
        previous = (tokens, columns)
    return packed, depths, placed


def _work(packed: list[list[int]], prefix: int, costs: tuple[float, float]) -> float:
    """Modelled FLOPs of a packing: every padded position's body, and every (query, key) pair
    the packed rows' attention computes (a dense mask computes them all)."""
    rows, width = len(packed), max(len(row) for row in packed)
    position, pair = costs
    return rows * width * (position + (prefix + width) * pair)


def tree_costs(model: Any) -> tuple[float, float]:
    """A model's forward FLOPs per position (its matmul weights but the embedding: 2 x each)
    and per attended (query, key) pair (4 x heads x head size, in each layer)."""
    config = model.config.get_text_config()
    embedding = model.get_input_embeddings().weight.numel()
    weights = sum(p.numel() for p in model.parameters()) - embedding
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        weights += embedding  # tied: the head's product is still done at every position
    heads = config.num_attention_heads
    size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2.0 * weights, 4.0 * heads * size * config.num_hidden_layers


def plan_token_tree(
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    min_prefix: int = 32,
    row_tokens: int | None = None,
    costs: tuple[float, float] = (1.0, 0.0),
) -> TokenTreePlan | None:
    """The token-tree plan of a batch, or None when it has nothing to score or a row whose
    real tokens are not contiguous.

    Args:
        input_ids: (B, P + C) prompt ids left-padded to ``P`` then completion ids right-padded to
            ``C`` (TRL's layout).
        attention_mask: (B, P + C), 1 on real tokens.
        logits_to_keep: ``C``, the completion width.
        min_prefix: The shortest shared prefix worth a pass of its own (shorter: none, every
            token is packed).
        row_tokens: Tokens per packed row; a row's own path is never split, so packed rows are
            at least as long as the longest path. Longer rows run fewer nodes twice (in two
            packed rows) and compute more attention. None: of 1, 2, 4 and 8 times the longest
            path, the one of least modelled work under ``costs``.
        costs: FLOPs per position and per attended (query, key) pair (:func:`tree_costs`;
            the default counts positions only).

    Every real completion token is scored. A row is cut after its last one: tokens after it
    predict nothing. The prefix stops before the earliest position that predicts a scored
    token, so every prediction is read from a packed node.

    Example:
        >>> import torch
        >>> ids = torch.tensor([[0, 5, 6, 7, 8], [5, 6, 7, 9, 0]])
        >>> mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
        >>> plan = plan_token_tree(ids, mask, logits_to_keep=2, min_prefix=1)
        >>> plan.prefix_ids.tolist(), plan.packed_ids.tolist(), plan.position_ids.tolist()
        ([[5]], [[6, 7]], [[1, 2]])
        >>> plan.targets.tolist(), plan.gather_index.tolist()
        ([7, 8, 9], [[0, 1], [2, 0]])
    """
    import torch

    batch, width = input_ids.shape
    if batch < 1 or logits_to_keep < 1 or logits_to_keep >= width:
        return None
    parsed = _row_tokens(input_ids, attention_mask, logits_to_keep)
    if parsed is None:
        return None
    rows, prompt_lengths, completion_lengths = parsed
    # Row i's scored tokens sit at t = prompt + j (j < completion) and are predicted at t - 1.
    live = [i for i in range(batch) if completion_lengths[i] > 0 and prompt_lengths[i] > 0]
    if not live:
        return None
    inputs = {i: rows[i][: len(rows[i]) - 1] for i in live}  # the last token predicts nothing
    first = min(prompt_lengths[i] - 1 for i in live)
    reference = inputs[live[0]]
    prefix = next(
        (k for k in range(first) if any(inputs[i][k] != reference[k] for i in live)), first
    )  # the rows' common prefix, up to the earliest predicting position
    if len(live) < 2 or prefix < max(1, min_prefix):
        prefix = 0
    # Rows in lexicographic order: a trie's depth-first order (see _pack).
    order = sorted(live, key=lambda i: inputs[i][prefix:])
    paths_past = [inputs[i][prefix:] for i in order]
    longest = max(len(tokens) for tokens in paths_past)
    if row_tokens is not None:
        packed, depths, placed = _pack(paths_past, max(row_tokens, longest))
    else:  # the packing of least modelled work, from rows of the longest path's length up
        layouts = [_pack(paths_past, longest * 2**k) for k in range(4)]
        packed, depths, placed = min(layouts, key=lambda layout: _work(layout[0], prefix, costs))
    paths = dict(zip(order, placed, strict=True))
    width_q = max(len(p) for p in packed)
    count = len(packed)
    packed_ids = torch.zeros((count, width_q), dtype=input_ids.dtype)
    position_ids = torch.arange(width_q).repeat(count, 1) + prefix
    ends = torch.arange(1, width_q + 1).repeat(count, 1)  # a node's subtree: [column, end)
    for r, (tokens, depth) in enumerate(zip(packed, depths, strict=True)):
        packed_ids[r, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype)
        position_ids[r, : len(depth)] = torch.tensor(depth) + prefix
    for i in order:
        r, columns = paths[i]
        if columns:
            path = torch.tensor(columns)
            ends[r, path] = torch.maximum(ends[r, path], torch.tensor(columns[-1] + 1))
    query = torch.arange(width_q).view(1, width_q, 1)
    key = torch.arange(width_q).view(1, 1, width_q)
    tree = (key <= query) & (query < ends.unsqueeze(1))  # key is an ancestor of query, or it
    attention = torch.cat([torch.ones((count, width_q, prefix), dtype=torch.bool), tree], dim=2)
    # The (node, next token) pairs, each once.
    pairs: dict[tuple[int, int, int], int] = {}
    gather = torch.zeros((batch, logits_to_keep), dtype=torch.long)
    scored = torch.zeros((batch, logits_to_keep), dtype=torch.bool)
    for i in live:
        r, columns = paths[i]
        for j in range(completion_lengths[i]):
            t = prompt_lengths[i] + j
            key_ = (r, columns[t - 1 - prefix], rows[i][t])
            gather[i, j] = pairs.setdefault(key_, len(pairs))
            scored[i, j] = True
    keys = torch.tensor(list(pairs), dtype=torch.long).view(-1, 3)
    device = input_ids.device
    return TokenTreePlan(
        prefix_ids=torch.tensor([inputs[live[0]][:prefix]], dtype=input_ids.dtype, device=device),
        packed_ids=packed_ids.to(device),
        position_ids=position_ids.to(device),
        attention_mask=attention.unsqueeze(1).to(device),
        logit_rows=keys[:, 0].to(device),
        logit_columns=keys[:, 1].to(device),
        targets=keys[:, 2].to(device=device, dtype=input_ids.dtype),
        gather_index=gather.to(device),
        scored=scored.to(device),
        nodes=sum(len(row) for row in packed),
    )


def tree_unsupported_reason(model: Any) -> str | None:
    """Why :func:`score_token_tree` cannot score with ``model`` (the bare causal LM, PEFT's
    base model for an adapter), or None.

    Beyond a plain, unscaled LM head on a ``base_model`` backbone
    (:func:`~trainers.sft.labelled_head.unsupported_reason`; LoRA adapters in the backbone and a
    forward wrapped for mixed precision are fine: the caller runs under the same autocast), the
    attention must take a custom boolean 4D mask and position ids as they are: SDPA attention,
    no sliding window.
    """
    reason = unsupported_reason(model, backbone_only=True)
    if reason is not None:
        return reason
    config = model.config.get_text_config()
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention != "sdpa":
        return f"its attention is {attention!r} (SDPA takes the tree's boolean 4D mask as it is)"
    sliding = getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    )
    if sliding or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "it uses sliding-window attention"
    return None


def score_token_tree(
    model: Any,
    plan: TokenTreePlan,
    *,
    temperature: float,
    compute_entropy: bool,
    autocast: Callable[[], AbstractContextManager[Any]],
    head_in_fp32: bool = False,
) -> tuple[Any, Any] | None:
    """The per-token logprobs (and entropies) of a planned batch's completion tokens, as TRL's
    fused head gives them: (B, C) each, 0.0 where the plan scores nothing.

    Args:
        model: The bare causal LM (:func:`tree_unsupported_reason` accepts it).
        plan: :func:`plan_token_tree` of the batch.
        temperature: The logits' divisor (TRL's fused head's).
        compute_entropy: Also return the entropies (else None).
        autocast: The mixed-precision context of the passes (``accelerator.autocast``).
        head_in_fp32: Project the LM head in float32, outside autocast
            (``cast_lm_head_to_fp32``).

    Returns:
        ``(logps, entropies)``, or None when the backbone returns no cache.
    """
    import contextlib

    import torch
    from trl.kernels import ChunkedLogProbFunction

    backbone = model.base_model
    head = model.get_output_embeddings()
    extra: dict[str, Any] = {}
    with autocast():
        if plan.prefix_ids.size(1):
            cache = output_cache(backbone(input_ids=plan.prefix_ids, use_cache=True))
            if cache is None:
                return None
            cache.batch_repeat_interleave(plan.packed_ids.size(0))
            extra[cache_keyword(backbone.forward)] = cache
        hidden = backbone(
            input_ids=plan.packed_ids,
            position_ids=plan.position_ids,
            attention_mask=plan.attention_mask,
            use_cache=False,
            **extra,
        ).last_hidden_state
        states = hidden[plan.logit_rows, plan.logit_columns]
        context: AbstractContextManager[Any] = contextlib.nullcontext()
        if head_in_fp32:
            states = states.float()
            context = torch.autocast(states.device.type, enabled=False)
        with context:
            log_probs, entropy, *_ = ChunkedLogProbFunction.apply(
                states.to(head.weight.device),
                head.weight,
                head.bias,
                plan.targets.to(head.weight.device),
                temperature,
                HEAD_CHUNK,
                None,
                1.0,
                ("entropy",) if compute_entropy else (),
            )
    unscored = ~plan.scored
    logps = log_probs[plan.gather_index].masked_fill(unscored, 0.0)
    entropies = entropy[plan.gather_index].masked_fill(unscored, 0.0) if compute_entropy else None
    return logps, entropies
