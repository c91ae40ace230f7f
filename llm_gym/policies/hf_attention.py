"""The decode engine's KV cache and attention: per-row buffers, one shared prefix, one packed step.

:class:`~llm_gym.policies.hf_engine.DecodeEngine` keeps, for every layer, the keys and values of
the prefix all episodes share (:attr:`KVCache.prefix_k`, computed once) and one buffer row per
episode (:attr:`KVCache.k_rows`). Each engine step is one forward pass of the unmodified
transformers model over a packed sequence; the model runs with the attention function registered
under :data:`ATTENTION_NAME`, which receives the step's layout (a :class:`StepPlan`) as the
keyword argument :data:`PLAN_KWARG`, writes the new keys and values into the rows' buffers and
attends each query to the shared prefix and its own row. A forward pass without a plan gets plain
SDPA attention. Only architectures whose attention goes through transformers'
``AttentionInterface`` with plain causal full attention are accepted (:func:`unsupported_reason`).

Shape names: ``B`` decode rows, ``N`` packed tokens, ``H`` query heads, ``Hkv`` key/value heads,
``G = H // Hkv``, ``D`` head size, ``P`` shared-prefix tokens, ``S`` row-buffer columns read.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from llm_gym.policies.kv_budget import MIN_WIDTH, buffer_shape

__all__ = [
    "ATTENTION_NAME",
    "PLAN_KWARG",
    "SUPPORTED_MODEL_TYPES",
    "KVCache",
    "KVCachePool",
    "POOL",
    "Prefill",
    "StepPlan",
    "register_attention",
    "unsupported_reason",
]

ATTENTION_NAME = "llm_gym_rows"
"""The name the engine's attention function is registered under in transformers."""

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Architectures whose attention is plain causal attention through ``AttentionInterface``."""

PLAN_KWARG = "llm_gym_plan"
"""The forward keyword argument that carries a :class:`StepPlan` to the attention function."""


def unsupported_reason(model: Any) -> str | None:
    """Why the engine cannot run ``model`` (None when it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"model_type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)} (the "
            "architectures whose attention the engine reproduces)"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"layer types {sorted(set(layer_types))} include windowed attention"
    if model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return "the model uses a sliding window"
    return None


def register_attention() -> None:
    """Register the engine's attention function with transformers (once)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ATTENTION_NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(ATTENTION_NAME, _attention)


def _attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    plan: StepPlan | None = kwargs.get(PLAN_KWARG)
    if plan is None:  # a forward pass that is not the engine's: plain attention
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return plan.attend(module.layer_idx, query, key, value, scaling), None


class KVCache:
    """Keys and values of the shared prefix and of every row, per layer.

    Row buffers are ``(rows, Hkv, columns + 1, D)``: a row's own tokens start at column 0 (its
    positions continue after the prefix it attends), and the last column is scratch, written by
    the dummy queries of rows that have nothing to feed.

    Args:
        num_layers: Decoder layers of the model.
        kv_heads: Key/value heads per layer (``Hkv``).
        head_dim: Size of one head (``D``).
        dtype: The model's dtype.
        device: The model's device.
    """

    @classmethod
    def for_model(cls, model: Any, dtype: torch.dtype, device: torch.device) -> KVCache:
        """A cache shaped for ``model``'s config (layers, key/value heads, head size)."""
        config = model.config
        heads = int(config.num_attention_heads)
        return cls(
            num_layers=int(config.num_hidden_layers),
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            dtype=dtype,
            device=device,
        )

    def __init__(
        self,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.prefix_k: list[torch.Tensor | None] = [None] * num_layers
        """Per layer, the shared prefix's keys ``(Hkv, P, D)`` (None before it is computed)."""
        self.prefix_v: list[torch.Tensor | None] = [None] * num_layers
        """Per layer, the shared prefix's values ``(Hkv, P, D)``."""
        self.k_rows: list[torch.Tensor] = []
        """Per layer, the rows' keys (empty until the first :meth:`ensure`)."""
        self.v_rows: list[torch.Tensor] = []
        """Per layer, the rows' values."""
        self.min_width = MIN_WIDTH
        """Fewest columns :meth:`ensure` allocates when the budget allows them."""

    @property
    def nbytes(self) -> int:
        """Bytes the row buffers hold."""
        return sum(b.numel() * b.element_size() for b in self.k_rows + self.v_rows)

    @property
    def scratch_column(self) -> int:
        """The buffers' last column (call :meth:`ensure` first)."""
        return self.k_rows[0].shape[2] - 1

    @property
    def column_bytes(self) -> int:
        """Bytes of one column of one row: its keys and values in every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.kv_heads * self.head_dim * element

    def bytes_for(self, rows: int, width: int) -> int:
        """Bytes of row buffers of exactly ``rows`` rows of ``width`` columns (the scratch
        column counted): the least :meth:`ensure` holds for them."""
        return rows * (width + 1) * self.column_bytes

    def ensure(self, rows: int, width: int, limit: int | None = None) -> None:
        """Row buffers that hold ``rows`` rows of ``width`` columns plus the scratch column,
        keeping the keys and values of the first ``rows`` rows and ``width`` columns.

        Buffers that already hold that shape are kept while they take at most ``limit`` bytes;
        otherwise they are allocated again in :func:`~llm_gym.policies.kv_budget.buffer_shape`'s
        shape (smaller ones too: rows past ``rows`` and columns past ``width`` are dropped), so
        the buffers take at most ``limit`` bytes unless ``bytes_for(rows, width)`` alone is
        over it.
        """
        if self.k_rows:
            have_rows, _, have_width = self.k_rows[0].shape[:3]
            holds = have_rows >= rows and have_width - 1 >= width
            if holds and (limit is None or self.nbytes <= limit):
                return
        new_rows, new_width = buffer_shape(rows, width, self.column_bytes, limit, self.min_width)
        shape = (new_rows, self.kv_heads, new_width + 1, self.head_dim)
        for buffers in (self.k_rows, self.v_rows):
            for layer in range(self.num_layers):
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if layer < len(buffers):
                    old = buffers[layer]
                    kept_rows, kept = min(rows, old.shape[0]), min(width, old.shape[2] - 1)
                    fresh[:kept_rows, :, :kept] = old[:kept_rows, :, :kept]
                    buffers[layer] = fresh  # the old layer's memory goes before the next one's
                else:
                    buffers.append(fresh)

    def move_row(self, source: int, target: int, columns: int) -> None:
        """Copy the first ``columns`` columns of row ``source`` into row ``target`` (nothing
        for none: a row seated since the last :meth:`ensure` holds no columns yet)."""
        if columns <= 0:
            return
        for buffers in (self.k_rows, self.v_rows):
            for buffer in buffers:
                buffer[target, :, :columns] = buffer[source, :, :columns]


class KVCachePool:
    """One idle :class:`KVCache` per model, handed to its next engine.

    Allocating the row buffers is a large part of a short collection's cost outside the model
    (on a CPU, ~100 MB of fresh pages for 64 rows of 256 columns, touched page by page), so an
    engine takes its model's idle cache when there is one and gives it back when it closes.

    The buffers keep the last collection's keys and values. Every column a query does not own
    is masked to ``-inf`` before the softmax, so it weighs exactly zero, and a reused buffer
    gives bit-identical outputs to a zeroed one as long as its values are finite: an engine
    whose model produced a non-finite logit does not give its cache back.

    Only CPU caches up to ``max_bytes`` are kept: on an accelerator the allocator already reuses
    freed blocks without faulting pages in, and memory held idle would be missing from the
    training step that runs between two collections. Models are held weakly (a cache goes with
    its model); a second engine running on the same model at once gets a fresh cache.
    Thread-safe.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._idle: weakref.WeakKeyDictionary[Any, KVCache] = weakref.WeakKeyDictionary()

    def take(self, model: Any, dtype: torch.dtype, device: torch.device) -> KVCache:
        """The model's idle cache (its shared prefix dropped), or a fresh one."""
        with self._lock:
            try:
                cache = self._idle.pop(model, None)
            except TypeError:  # a model that cannot be held weakly
                cache = None
        if cache is None or cache.dtype != dtype or cache.device != device:
            return KVCache.for_model(model, dtype, device)
        cache.prefix_k = [None] * cache.num_layers
        cache.prefix_v = [None] * cache.num_layers
        return cache

    def give_back(self, model: Any, cache: KVCache) -> None:
        """Keep ``cache`` for ``model``'s next engine (replacing a smaller idle one), when it
        lives on the CPU and holds at most ``max_bytes``."""
        if cache.device.type != "cpu" or cache.nbytes > self.max_bytes:
            return
        with self._lock:
            try:
                held = self._idle.get(model)
                if held is None or held.nbytes <= cache.nbytes:
                    self._idle[model] = cache
            except TypeError:
                pass

    def clear(self) -> None:
        """Drop every idle cache (their memory goes back to the allocator)."""
        with self._lock:
            self._idle.clear()


POOL = KVCachePool()
"""The idle caches every :class:`~llm_gym.policies.hf_engine.DecodeEngine` shares."""


@dataclass
class Prefill:
    """One row's new tokens in a packed step (more than one: a prefill, not a decode)."""

    start: int
    """Its first token's index in the packed sequence."""
    length: int
    """Its tokens."""
    slot: int
    """The row's buffer index."""
    column: int
    """Its first token's column in the row buffer."""
    prefix_len: int
    """Tokens of the shared prefix the row attends."""
    mask: torch.Tensor
    """``(length, prefix_len + column + length)``: True where a query may attend."""


class StepPlan:
    """The layout of one engine step, read by the attention function in every layer.

    The packed sequence holds first one query per decode row (``decode_rows`` of them, each
    writing to ``write_rows`` / ``write_cols`` and masked by ``bias``), then the tokens of every
    :class:`Prefill`. With ``prefix_mode`` the sequence is the shared prefix itself, whose keys
    and values are kept in the cache.
    """

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.prefix_mode = False
        self.decode_rows = 0
        self.width = 0
        self.bias: torch.Tensor | None = None
        self.write_rows: torch.Tensor | None = None
        self.write_cols: torch.Tensor | None = None
        self.prefills: list[Prefill] = []

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """Attention for the packed queries ``q`` (1, H, N, D); returns (1, N, H, D)."""
        cache = self.cache
        if self.prefix_mode:  # the shared prefix itself: plain causal attention, kept
            cache.prefix_k[layer] = k[0].clone()
            cache.prefix_v[layer] = v[0].clone()
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scaling, enable_gqa=True
            )
            return out.transpose(1, 2)
        k_buf, v_buf = cache.k_rows[layer], cache.v_rows[layer]
        k_buf[self.write_rows, :, self.write_cols] = k[0].transpose(0, 1)
        v_buf[self.write_rows, :, self.write_cols] = v[0].transpose(0, 1)
        _, heads, _, dim = q.shape
        kv_heads = k.shape[1]
        groups = heads // kv_heads
        k_pre, v_pre = cache.prefix_k[layer], cache.prefix_v[layer]
        prefix = 0 if k_pre is None else k_pre.shape[1]
        outs = []
        rows = self.decode_rows
        if rows:
            q_BKGD = q[0, :, :rows].transpose(0, 1).reshape(rows, kv_heads, groups, dim)
            k_rows = k_buf[:rows, :, : self.width]
            v_rows = v_buf[:rows, :, : self.width]
            scores = torch.matmul(q_BKGD, k_rows.transpose(-1, -2))  # (B, Hkv, G, S)
            if prefix:
                q_K_BG_D = q_BKGD.permute(1, 0, 2, 3).reshape(kv_heads, rows * groups, dim)
                pre = torch.matmul(q_K_BG_D, k_pre.transpose(-1, -2))  # (Hkv, B*G, P)
                pre = pre.view(kv_heads, rows, groups, prefix).permute(1, 0, 2, 3)
                scores = torch.cat([pre, scores], dim=-1)
            probs = torch.softmax(scores * scaling + self.bias, dim=-1, dtype=torch.float32)
            probs = probs.to(q.dtype)
            out = torch.matmul(probs[..., prefix:], v_rows)  # (B, Hkv, G, D)
            if prefix:
                p_pre = (
                    probs[..., :prefix].permute(1, 0, 2, 3).reshape(kv_heads, rows * groups, prefix)
                )
                out_pre = torch.matmul(p_pre, v_pre).view(kv_heads, rows, groups, dim)
                out = out + out_pre.permute(1, 0, 2, 3)
            outs.append(out.reshape(rows, heads, dim))
        for item in self.prefills:
            end = item.column + item.length
            keys = k_buf[item.slot, :, :end]
            values = v_buf[item.slot, :, :end]
            if item.prefix_len:
                keys = torch.cat([k_pre[:, : item.prefix_len], keys], dim=1)
                values = torch.cat([v_pre[:, : item.prefix_len], values], dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, item.start : item.start + item.length],
                keys[None],
                values[None],
                attn_mask=item.mask,
                scale=scaling,
                enable_gqa=True,
            )  # (1, H, n, D)
            outs.append(out[0].transpose(0, 1))
        return torch.cat(outs, dim=0)[None] if len(outs) > 1 else outs[0][None]
