"""The rollout limit: replay the token streams our engine produced, as pure model work.

``collect_groups`` spends its time on three things: the model's forward passes, the scheduling
that decides what each pass holds, and everything that is not the model (environments, the
tokenizer and chat template, sampling, the event loop). The replay keeps only the first. It takes
the episodes a collection produced, with every sampled token and every environment reply in
order (``Episode.samples``), and runs the same model over exactly those tokens with no
environment, tokenizer, sampler or event loop:

* the shared prefix (the system prompt and tool specs every episode starts with) is prefilled
  once, and every row attends that one copy;
* each episode's question, and each environment reply (after the previous turn's last sampled
  token), is prefilled once, into the episode's own KV-cache row;
* every sampled token is decoded at the largest batch possible: pass ``k`` holds the ``k``-th
  piece of work of every episode that has one (a decode of its ``k``-th sampled token, or a
  prefill whose last position yields it), so the passes number the longest episode's sampled
  tokens plus one (the prefix), the fewest any schedule can take, each as wide as the episodes
  allow;
* every step's layout is built before the clock starts: only forward passes are timed.

Each pass produces the logits of exactly the tokens our engine sampled, from exactly the context
it sampled them in (:func:`replay_logprobs` checks this against the recorded logprobs). The passes
run through the engine's own KV cache and attention (:mod:`llm_gym.policies.hf_attention`), so the
replay is the limit of *this* engine's model work: ours as a percentage of it is at most 100% by
construction, and the gap is what scheduling and the environment loop cost. A faster attention
kernel would raise both; the second reference, HF ``generate`` over a prefilled shared-prefix cache
(:func:`time_generate`), is the check against transformers' own decoding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from llm_gym.policies.hf_attention import (
    ATTENTION_NAME,
    PLAN_KWARG,
    KVCache,
    Prefill,
    StepPlan,
    register_attention,
    unsupported_reason,
)

__all__ = ["Op", "Replay", "Stream", "episode_streams", "replay_logprobs", "time_generate"]


@dataclass
class Op:
    """One episode's work in one forward pass: a decode (one id) or a prefill (more)."""

    prefix_len: int
    """Tokens of the shared prefix the episode attends."""
    column: int
    """Where the first id goes in the episode's cache row (its own tokens, after the prefix)."""
    ids: list[int]
    """The ids fed; the logits at the last one sample the episode's next token."""


@dataclass
class Stream:
    """One episode's forward work in order: ``ops[k]`` yields sampled token ``sampled[k]``."""

    ops: list[Op] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    """The sampled ids, in order."""
    logprobs: list[float] = field(default_factory=list)
    """The sampler's recorded logprob of each."""


def shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The longest prefix every prompt shares, leaving each at least one id of its own (the
    engine's rule: a prompt's last position must be fed to sample from it).

    Example:
        >>> shared_prefix([[1, 2, 3, 4], [1, 2, 5]])
        [1, 2]
        >>> shared_prefix([[1, 2, 3], [1, 2, 3]])
        [1, 2]
    """
    first = list(prompts[0])
    n = min(len(p) for p in prompts) - 1
    for ids in prompts[1:]:
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return first[: max(n, 0)]


def stream_of(samples: Sequence[Any], prefix: Sequence[int]) -> Stream:
    """An episode's :class:`Stream` from its token samples (``TokenSample``: ``prompt_ids``,
    ``completion_ids``, ``env_mask`` 1 for sampled ids). Each sample starts a cache row afresh
    (the engine rebuilds a row whose context is not an extension of the last); what follows a
    sample's last sampled token (that token, and a reply no turn read) was never fed.

    Example:
        >>> from types import SimpleNamespace as S
        >>> s = S(prompt_ids=[7, 7, 1], completion_ids=[5, 6, 2, 2, 8, 3],
        ...       env_mask=[1, 1, 0, 0, 1, 0], logprobs=[-1.0, -2.0, 0.0, 0.0, -3.0, 0.0])
        >>> [(op.column, op.ids) for op in stream_of([s], [7, 7]).ops]
        [(0, [1]), (1, [5]), (2, [6, 2, 2])]
        >>> stream_of([s], [7, 7]).sampled
        [5, 6, 8]
    """
    stream = Stream()
    for sample in samples:
        prompt = list(sample.prompt_ids)
        ids = prompt + list(sample.completion_ids)
        mask = [0] * len(prompt) + list(sample.env_mask)
        logprobs = [0.0] * len(prompt) + list(sample.logprobs)
        limit = min(len(prefix), len(prompt) - 1)
        prefix_len = 0
        while prefix_len < limit and prefix[prefix_len] == prompt[prefix_len]:
            prefix_len += 1
        start = prefix_len
        for i in range(len(prompt), len(ids)):
            if mask[i]:
                stream.ops.append(Op(prefix_len, start - prefix_len, ids[start:i]))
                stream.sampled.append(ids[i])
                stream.logprobs.append(logprobs[i])
                start = i
    return stream


def episode_streams(episodes: Sequence[Any]) -> tuple[list[int], list[Stream]]:
    """The shared prefix and one :class:`Stream` per episode that sampled a token."""
    sampled = [e for e in episodes if any(sum(s.env_mask) for s in e.samples)]
    if not sampled:
        raise ValueError("No episode holds a sampled token: nothing to replay.")
    prefix = shared_prefix([e.samples[0].prompt_ids for e in sampled])
    return prefix, [stream_of(e.samples, prefix) for e in sampled]


class Replay:
    """The timed replay of ``streams`` (see the module docstring); build once, :meth:`run` often.

    Args:
        model: The causal LM our engine ran (an architecture the engine covers).
        prefix: The shared prefix ids.
        streams: The episodes' streams.
        pad_id: The id fed for a row that prefills in a pass (a dummy query, as in the engine:
            the decode batch reads rows ``0..B-1`` of the cache).
    """

    def __init__(self, model: Any, prefix: list[int], streams: Sequence[Stream], pad_id: int):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"The replay runs the engine's attention, which cannot run: {reason}")
        register_attention()
        self.model = model
        self.device = next(model.parameters()).device
        # Longest first: the episodes still running at pass k are rows 0..B_k-1, none moves.
        self.order = sorted(range(len(streams)), key=lambda i: -len(streams[i].ops))
        self.streams = [streams[i] for i in self.order]
        self.prefix = list(prefix)
        self.tokens = sum(len(s.ops) for s in self.streams)
        self.prefill_tokens = len(prefix) + sum(
            len(op.ids) for s in self.streams for op in s.ops if len(op.ids) > 1
        )
        self.cache = KVCache.for_model(model, next(model.parameters()).dtype, self.device)
        width = max(op.column + len(op.ids) for s in self.streams for op in s.ops)
        self.cache.ensure(len(self.streams), width)
        self.steps = [self._plan(k, pad_id) for k in range(len(self.streams[0].ops))]
        self.passes = len(self.steps) + (1 if self.prefix else 0)
        self.prefix_keep = torch.tensor([max(len(self.prefix) - 1, 0)], device=self.device)

    def _plan(self, k: int, pad_id: int) -> tuple[StepPlan, torch.Tensor, torch.Tensor, Any, list]:
        device, cache = self.device, self.cache
        live = [s for s in self.streams if len(s.ops) > k]
        rows, prefix = len(live), len(self.prefix)
        tokens, positions, write_cols, visible, keep, outputs = [], [], [], [], [], []
        for row, stream in enumerate(live):
            op = stream.ops[k]
            if len(op.ids) == 1:
                tokens.append(op.ids[0])
                positions.append(op.prefix_len + op.column)
                write_cols.append(op.column)
                visible.append(op.column + 1)
                keep.append(row)
                outputs.append(row)
            else:
                tokens.append(pad_id)
                positions.append(0)
                write_cols.append(cache.scratch_column)
                visible.append(1)
        plan = StepPlan(cache)
        plan.decode_rows, plan.width = rows, max(visible)
        write_rows = list(range(rows))
        for row, stream in enumerate(live):
            op = stream.ops[k]
            n = len(op.ids)
            if n < 2:
                continue
            start, base = len(tokens), op.prefix_len + op.column
            tokens.extend(op.ids)
            positions.extend(range(base, base + n))
            write_rows.extend([row] * n)
            write_cols.extend(range(op.column, op.column + n))
            keys = torch.arange(base + n, device=device)
            queries = torch.arange(base, base + n, device=device)
            mask = keys[None, :] <= queries[:, None]
            plan.prefills.append(Prefill(start, n, row, op.column, op.prefix_len, mask))
            keep.append(start + n - 1)
            outputs.append(row)
        bias = torch.zeros((rows, prefix + plan.width), dtype=cache.dtype, device=device)
        seen = torch.tensor(visible, device=device)
        columns = torch.arange(plan.width, device=device)
        bias[:, prefix:].masked_fill_(columns[None, :] >= seen[:, None], float("-inf"))
        lens = torch.tensor([s.ops[k].prefix_len for s in live], device=device)
        hidden = torch.arange(prefix, device=device)[None, :] >= lens[:, None]
        bias[:, :prefix].masked_fill_(hidden, float("-inf"))
        plan.bias = bias.view(rows, 1, 1, prefix + plan.width)
        plan.write_rows = torch.tensor(write_rows, device=device)
        plan.write_cols = torch.tensor(write_cols, device=device)
        ids = torch.tensor([tokens], device=device)
        return (
            plan,
            ids,
            torch.tensor([positions], device=device),
            torch.tensor(keep, device=device),
            outputs,
        )

    def _forward(self, plan: StepPlan, ids, positions, keep) -> torch.Tensor:
        output = self.model(
            input_ids=ids,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=keep,
            **{PLAN_KWARG: plan},
        )
        return output.logits[0]

    def run(self, logprobs: list[list[float]] | None = None) -> float:
        """Run every pass; return the seconds they took. With ``logprobs`` (a list), append
        each stream's ``log_softmax`` of its sampled tokens to it, in the input's order (a check,
        not timed work: leave it None when timing)."""
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = ATTENTION_NAME
        found: list[list[float]] = [[] for _ in self.streams]
        try:
            with torch.inference_mode():
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                if self.prefix:
                    plan = StepPlan(self.cache)
                    plan.prefix_mode = True
                    n = len(self.prefix)
                    ids = torch.tensor([self.prefix], device=self.device)
                    positions = torch.arange(n, device=self.device)[None]
                    self._forward(plan, ids, positions, self.prefix_keep)
                for k, (plan, ids, positions, keep, outputs) in enumerate(self.steps):
                    logits = self._forward(plan, ids, positions, keep)
                    if logprobs is not None:
                        lp = torch.log_softmax(logits.float(), dim=-1)
                        for j, row in enumerate(outputs):
                            found[row].append(lp[j, self.streams[row].sampled[k]].item())
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - start
        finally:
            config._attn_implementation = previous
        if logprobs is not None:
            back = [[] for _ in found]
            for row, i in enumerate(self.order):
                back[i] = found[row]
            logprobs.extend(back)
        return wall


def replay_logprobs(model: Any, episodes: Sequence[Any], pad_id: int) -> list[tuple[list, list]]:
    """``(replayed, recorded)`` logprobs of every stream's sampled tokens: equal (to float
    rounding) when the replay computes what the engine computed."""
    prefix, streams = episode_streams(episodes)
    found: list[list[float]] = []
    Replay(model, prefix, streams, pad_id).run(logprobs=found)
    return [(got, stream.logprobs) for got, stream in zip(found, streams, strict=True)]


def time_generate(
    model: Any,
    prefix: list[int],
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    pad_id: int,
    seed: int = 0,
) -> float:
    """Seconds for HF ``generate`` to sample ``new_tokens`` after each prompt, every row forced
    to the full length, with the shared ``prefix`` prefilled once into a cache copied to every
    row (the prompts' own suffixes are left-padded between the prefix and them)."""
    from transformers import DynamicCache

    from trainers.grpo.shared_prefix import cache_keyword

    keyword = cache_keyword(model.forward)  # ``cache`` in transformers 5.2x, else the old name
    device = next(model.parameters()).device
    suffixes = [list(p[len(prefix) :]) for p in prompts]
    width = max(len(s) for s in suffixes)
    rows = len(suffixes)
    ids = torch.full((rows, len(prefix) + width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[:, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    mask[:, : len(prefix)] = 1
    for row, suffix in enumerate(suffixes):
        ids[row, ids.shape[1] - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        mask[row, ids.shape[1] - len(suffix) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        cached: dict[str, Any] = {}
        if prefix:
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:1, : len(prefix)], use_cache=True, **{keyword: cache})
            cache.batch_repeat_interleave(rows)
            cached[keyword] = cache
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
            **cached,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start
