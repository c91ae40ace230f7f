"""The continuous-batching decode engine behind :class:`~llm_gym.policies.hf.HFPolicy`.

One engine serves one collection. Every episode holds a *row*: its KV cache lives for the whole
episode, so a turn prefills only the tokens the environment appended (token-in/token-out makes the
new context a prefix extension of the old one; when it is not, because the template rewrote
history, the row is rebuilt from the new ids). A row whose turn ends is handed back at once and
rejoins the running batch as soon as its environment has stepped: no wave waits for its slowest
turn, and finished rows cost no decode steps.

The prefix every episode shares (the system prompt and tool specs) is prefilled once and attended
by all rows from one copy, instead of once per episode per turn.

Each engine step is one forward pass of the unmodified transformers model over a packed sequence:
one token for each row in the decode batch (a dummy for rows that wait for their environment),
followed by the new tokens of the rows being prefilled. This module schedules the rows and builds
each step's layout; :mod:`llm_gym.policies.hf_attention` holds the KV cache and the attention
function that reads the layout, :mod:`llm_gym.policies.hf_sampling` the sampling law (a row's
logits masked first by its turn's :class:`~llm_gym.policies.constraint.LogitsConstraint`).

The key/value budget holds at every step, whatever the episodes' widths grow to: episodes take a
row in the order they first asked for a turn (a queue served head first, so none waits for ever),
when the live rows, each at the width its current turn may reach, fit in the budget beside it;
and before each forward pass, while the live rows' buffers would pass the budget, the newest row
gives its row up (an idle one first): its keys and values are dropped and computed again when it
has a row back, its turn going on where it stopped. Buffers are allocated for the live rows, so
they shrink when rows leave. One row always runs, alone when it is larger than the budget. Each
episode samples from a stream of its own, so the budget changes how rows are batched, never the
draws a seeded episode samples with: greedy episodes are the same at any budget, and sampled ones
are too unless the batch's shape moves the logits' last bits across a draw (a long-tail token at
temperature > 0, as a different ``max_rows`` does).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from llm_gym.policies.constraint import LogitsConstraint, mask_row
from llm_gym.policies.hf_attention import (
    ATTENTION_NAME,
    PLAN_KWARG,
    POOL,
    KVCache,
    Prefill,
    StepPlan,
    register_attention,
    unsupported_reason,
)
from llm_gym.policies.hf_rows import FinishedTurn, Row
from llm_gym.policies.hf_sampling import row_stream, sample
from llm_gym.policies.kv_budget import default_kv_budget

__all__ = [
    "ATTENTION_NAME",
    "DecodeEngine",
    "FinishedTurn",
    "default_kv_budget",
    "unsupported_reason",
]


class DecodeEngine:
    """Continuous batching over per-episode KV caches (see the module docstring).

    Synchronous and single-threaded: :meth:`step` admits new turns, runs one forward pass and
    returns the turns that finished. The async side lives in ``HFPolicy``'s stream.

    Args:
        model: A causal LM for which :func:`unsupported_reason` is None.
        eos_ids: Ids that end a turn.
        pad_id: The id fed for rows that wait (its output is discarded).
        temperature: 0 for greedy decoding.
        top_p: Nucleus mass (transformers' ``TopPLogitsWarper`` rule).
        seed: Seeds each episode's own sampling stream, from the seed and the episode's key
            (:func:`~llm_gym.policies.hf_sampling.row_stream`); None: torch's global generator.
        max_rows: Most episodes holding a row at once (None: no limit); others queue.
        kv_budget_bytes: Most bytes the rows' buffers of keys and values may take (the shared
            prefix's one copy aside; None:
            :func:`~llm_gym.policies.kv_budget.default_kv_budget`), at every step (see the
            module docstring; a 135M-parameter model holds ~46 KB a token): over it only while
            one episode larger than it runs alone.
    """

    def __init__(
        self,
        model: Any,
        *,
        eos_ids: Sequence[int],
        pad_id: int,
        temperature: float,
        top_p: float,
        seed: int | None = None,
        max_rows: int | None = None,
        kv_budget_bytes: int | None = None,
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"DecodeEngine cannot run this model: {reason}.")
        register_attention()
        self.model = model
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.pad_id = int(pad_id)
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.max_rows = max_rows
        self.kv_budget_bytes = (
            default_kv_budget(self.device) if kv_budget_bytes is None else int(kv_budget_bytes)
        )
        self.prefix_ids: list[int] | None = None
        self.cache: KVCache = POOL.take(model, self.dtype, self.device)
        self.rows: dict[Hashable, Row] = {}
        self.slots: list[Row] = []
        self.queue: list[Row] = []
        """Rows waiting for a buffer row with a turn to run, oldest first."""
        self._arrivals = 0
        self.evictions = 0
        """Times a row gave its buffer row up to keep the budget."""
        self.forward_passes = 0
        self.rows_per_pass: list[int] = []
        self.prefilled_tokens = 0
        self._stepping = False
        self._constraints: dict[Hashable, LogitsConstraint | None] = {}
        self._finite = True
        self.version = -1
        """The weight version sampling now (set by the owner when it swaps weights in)."""

    def close(self) -> None:
        """Give the KV cache back to the pool for the model's next engine (the engine must
        not step again)."""
        # Not reusable while a step still runs in some thread, nor after the model produced a
        # NaN or inf (a NaN logprob): masked columns weigh exactly zero only when finite.
        if self._stepping or not self._finite:
            return
        cache, self.cache = self.cache, KVCache.for_model(self.model, self.dtype, self.device)
        self.rows.clear()
        self.slots.clear()
        self.queue.clear()
        if cache.k_rows:
            POOL.give_back(self.model, cache)

    # --- rows ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Some row has tokens to feed (queued turns wait for a row, not for a step)."""
        return any(row.pending for row in self.slots) or bool(self.queue and not self.slots)

    def _prefix_len(self, ids: Sequence[int]) -> int:
        prefix = self.prefix_ids or []
        limit = min(len(prefix), len(ids) - 1)
        n = 0
        while n < limit and prefix[n] == ids[n]:
            n += 1
        return n

    def _rebuild(self, row: Row, ids: list[int]) -> None:
        row.prefix_len = self._prefix_len(ids)
        row.fed = []
        row.pending = ids[row.prefix_len :]
        row.last = None
        row.stale = False

    def _admit(self, key: Hashable, ids: list[int], budget: int) -> None:
        if not ids:
            raise ValueError("Expected at least one prompt id, got none.")
        row = self.rows.get(key)
        if row is None:
            rng = None if self.seed is None else row_stream(self.seed, key)
            row = self.rows[key] = Row(key=key, order=self._arrivals, rng=rng)
            self._arrivals += 1
            self._rebuild(row, ids)
            self._enqueue(row)
        elif row.pending:
            raise RuntimeError(f"Episode {key!r} asked for a turn while its last one runs.")
        elif row.slot < 0:  # it gave its row up: its keys and values are computed again
            self._rebuild(row, ids)
            self._enqueue(row)
        elif row.stale:  # the weights changed since its cache was filled: prefill it again
            self._rebuild(row, ids)
        else:
            known = row.prefix_len + len(row.fed)
            held = row.fed + ([row.last] if row.last is not None else [])
            extends = (
                len(ids) > known
                and ids[row.prefix_len : row.prefix_len + len(held)] == held
                and ids[: row.prefix_len] == (self.prefix_ids or [])[: row.prefix_len]
            )
            if extends:
                row.pending = ids[known:]
                row.last = None
            else:  # the context is not an extension (a template rewrote history): rebuild
                self._rebuild(row, ids)
        row.budget = budget
        row.constraint = self._constraints.pop(key, None)
        row.out_ids, row.out_logprobs, row.out_versions = [], [], []

    def _enqueue(self, row: Row) -> None:
        bisect.insort(self.queue, row, key=lambda r: r.order)

    def _release(self, key: Hashable) -> None:
        row = self.rows.pop(key, None)
        if row is None:
            return
        if row.slot >= 0:
            self._unseat(row)
        elif row in self.queue:
            self.queue.remove(row)

    def _unseat(self, row: Row) -> None:
        last = self.slots.pop()
        if last is not row:  # keep rows dense: move the last row into the freed slot
            self.cache.move_row(last.slot, row.slot, len(last.fed))
            last.slot = row.slot
            self.slots[row.slot] = last
        row.slot = -1

    def _room(self, row: Row) -> bool:
        """Whether ``row`` may take a buffer row now: within ``max_rows``, and the live rows
        and it, each at its :attr:`~llm_gym.policies.hf_rows.Row.horizon`, within the byte
        budget (a row is always seated when none is)."""
        rows = len(self.slots)
        if self.max_rows is not None and rows >= self.max_rows:
            return False
        if rows == 0:
            return True
        width = max(r.horizon for r in [*self.slots, row])
        return self.cache.bytes_for(rows + 1, width) <= self.kv_budget_bytes

    def _seat(self) -> None:
        """Give buffer rows to the queue, head first: none passes a head that does not fit."""
        while self.queue and self._room(self.queue[0]):
            row = self.queue.pop(0)
            row.slot = len(self.slots)
            self.slots.append(row)

    def _fit(self) -> int:
        """Give rows up, newest first (idle ones before those sampling), until the live rows'
        buffers fit in the budget or one row is left; returns the widest live row's columns.
        A row sampling a turn is queued again, its whole context to feed; an idle one is
        rebuilt at its next turn."""
        while True:
            need = max(r.width for r in self.slots)
            rows = len(self.slots)
            if rows == 1 or self.cache.bytes_for(rows, need) <= self.kv_budget_bytes:
                return need
            row = max(self.slots, key=lambda r: (not r.pending, r.order))
            self._unseat(row)
            self.evictions += 1
            if row.pending:
                row.pending = row.fed + row.pending
                self._enqueue(row)
            row.fed, row.last = [], None

    # --- the shared prefix -----------------------------------------------------------------

    def _set_prefix(self, prompts: Sequence[list[int]]) -> None:
        first = prompts[0]
        n = len(first) - 1
        for ids in prompts[1:]:
            n = min(n, len(ids) - 1)
            i = 0
            while i < n and ids[i] == first[i]:
                i += 1
            n = i
        self.prefix_ids = list(first[:n])
        self._prefill_prefix(len(prompts))

    def _prefill_prefix(self, rows: int) -> None:
        n = len(self.prefix_ids or [])
        if n:
            plan = StepPlan(self.cache)
            plan.prefix_mode = True
            ids = torch.tensor([self.prefix_ids], device=self.device)
            positions = torch.arange(n, device=self.device)[None]
            self._forward(plan, ids, positions, torch.tensor([n - 1], device=self.device))
            self.rows_per_pass.append(rows)
            self.prefilled_tokens += n

    def invalidate(self) -> None:
        """The model's weights changed: drop every cached key and value computed under the old
        ones. The shared prefix is prefilled again now; a row sampling a turn feeds its whole
        context again at the next step (its turn goes on, every later token sampled by the new
        weights over a context they encoded); an idle row is rebuilt at its next turn."""
        with torch.inference_mode():
            self._prefill_prefix(len(self.slots))
        for row in self.slots:
            if row.pending:
                row.pending = row.fed + row.pending
                row.fed = []
            else:
                row.stale = True

    # --- one step --------------------------------------------------------------------------

    def step(
        self,
        admits: Sequence[tuple[Hashable, list[int], int]],
        releases: Sequence[Hashable] = (),
        constraints: Mapping[Hashable, LogitsConstraint] | None = None,
    ) -> list[FinishedTurn]:
        """Admit turns ``(key, context ids, token budget)`` (each following ``constraints[key]``
        when there is one), drop released episodes, run one forward pass, return the turns that
        ended in it."""
        self._stepping = True
        try:
            self._constraints.update({k: (constraints or {}).get(k) for k, *_ in admits})
            return self._step(admits, releases)
        finally:
            self._stepping = False

    def _step(
        self, admits: Sequence[tuple[Hashable, list[int], int]], releases: Sequence[Hashable]
    ) -> list[FinishedTurn]:
        with torch.inference_mode():
            for key in releases:
                self._release(key)
            if admits and self.prefix_ids is None:
                self._set_prefix([list(ids) for _, ids, _ in admits])
            for key, ids, budget in admits:
                self._admit(key, list(ids), budget)
            self._seat()
            if not any(row.pending for row in self.slots):
                return []
            need = self._fit()
            active = [row for row in self.slots if row.pending]
            if not active:  # the rows sampling gave theirs up to an older idle row
                return []
            return self._decode_step(active, need)

    def _decode_step(self, active: list[Row], need: int) -> list[FinishedTurn]:
        rows = len(self.slots)
        self.cache.ensure(rows, need, self.kv_budget_bytes)
        scratch = self.cache.scratch_column
        prefix = len(self.prefix_ids or [])
        tokens: list[int] = []
        positions: list[int] = []
        write_cols: list[int] = []
        visible: list[int] = []
        prefix_lens: list[int] = []
        keep: list[int] = []  # packed index of each sampled row's last token
        sampled: list[Row] = []
        for row in self.slots:
            prefix_lens.append(row.prefix_len)
            if len(row.pending) == 1:
                column = len(row.fed)
                tokens.append(row.pending[0])
                positions.append(row.prefix_len + column)
                write_cols.append(column)
                visible.append(column + 1)
                keep.append(row.slot)
                sampled.append(row)
            else:  # idle or prefilling: a dummy query that sees column 0, written to scratch
                tokens.append(self.pad_id)
                positions.append(0)
                write_cols.append(scratch)
                visible.append(1)
        write_rows = list(range(rows))
        plan = StepPlan(self.cache)
        plan.decode_rows = rows
        plan.width = max(visible)
        for row in self.slots:
            n = len(row.pending)
            if n < 2:
                continue
            start, column = len(tokens), len(row.fed)
            tokens.extend(row.pending)
            base = row.prefix_len + column
            positions.extend(range(base, base + n))
            write_rows.extend([row.slot] * n)
            write_cols.extend(range(column, column + n))
            keys = torch.arange(base + n, device=self.device)
            queries = torch.arange(base, base + n, device=self.device)
            mask = keys[None, :] <= queries[:, None]
            plan.prefills.append(Prefill(start, n, row.slot, column, row.prefix_len, mask))
            keep.append(start + n - 1)
            sampled.append(row)
            self.prefilled_tokens += n
        device = self.device
        columns = torch.arange(plan.width, device=device)
        seen = torch.tensor(visible, device=device)
        bias = torch.zeros((rows, prefix + plan.width), dtype=self.dtype, device=device)
        bias[:, prefix:].masked_fill_(columns[None, :] >= seen[:, None], float("-inf"))
        if prefix and min(prefix_lens) < prefix:
            lens = torch.tensor(prefix_lens, device=device)
            hidden = torch.arange(prefix, device=device)[None, :] >= lens[:, None]
            bias[:, :prefix].masked_fill_(hidden, float("-inf"))
        plan.bias = bias.view(rows, 1, 1, prefix + plan.width)
        plan.write_rows = torch.tensor(write_rows, device=device)
        plan.write_cols = torch.tensor(write_cols, device=device)
        logits = self._forward(
            plan,
            torch.tensor([tokens], device=device),
            torch.tensor([positions], device=device),
            torch.tensor(keep, device=device),
        )
        self.rows_per_pass.append(len(active))
        for i, row in enumerate(sampled):
            if row.constraint is not None:
                mask_row(logits[i], row.constraint)
        uniforms = None
        if self.seed is not None and self.temperature > 0:
            uniforms = [row.rng.random() for row in sampled]  # type: ignore[union-attr]
        ids, logprobs = sample(
            logits, temperature=self.temperature, top_p=self.top_p, uniforms=uniforms
        )
        if any(lp != lp for lp in logprobs):  # a NaN logprob: some key or value was not finite
            self._finite = False
        finished = []
        for row, token, logprob in zip(sampled, ids, logprobs, strict=True):
            row.fed.extend(row.pending)
            row.out_ids.append(token)
            row.out_logprobs.append(logprob)
            row.out_versions.append(self.version)
            if row.constraint is not None:
                row.constraint.advance(token)
            stop = token in self.eos_ids
            if stop or len(row.out_ids) >= row.budget:
                row.pending, row.last, row.constraint = [], token, None
                reason = "stop" if stop else "length"
                finished.append(
                    FinishedTurn(row.key, row.out_ids, row.out_logprobs, reason, row.out_versions)
                )
            else:
                row.pending = [token]
        return finished

    def _forward(
        self, plan: StepPlan, ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        try:
            output = self.model(
                input_ids=ids,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=keep,
                **{PLAN_KWARG: plan},
            )
        finally:
            config._attn_implementation = previous
        self.forward_passes += 1
        return output.logits[0]
