"""The decode engine's records: an episode's row, and a turn the engine finished."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FinishedTurn", "Row"]


@dataclass
class FinishedTurn:
    """One assistant turn the engine finished."""

    key: Hashable
    """The episode it belongs to."""
    token_ids: list[int]
    """The sampled ids (the end-of-turn token included when it was sampled)."""
    logprobs: list[float]
    """``log_softmax(logits / temperature)`` of each sampled id."""
    finish_reason: str
    """``"stop"`` or ``"length"``."""
    versions: list[int] = field(default_factory=list)
    """The engine's ``version`` when each id was sampled."""


@dataclass
class Row:
    """One episode's state in the engine: where its keys and values are, and its turn."""

    key: Hashable
    """The episode."""
    order: int
    """When the episode first asked for a turn (its place in the queue)."""
    rng: random.Random | None = None
    """Its sampling stream (None: torch's global generator)."""
    slot: int = -1
    """Its buffer row (-1 while it holds none: queued, or idle after giving its row up)."""
    prefix_len: int = 0
    """Tokens of the shared prefix this row attends (its own tokens start at that position)."""
    fed: list[int] = field(default_factory=list)
    """The row's own ids whose keys and values are in its buffer (after its prefix)."""
    pending: list[int] = field(default_factory=list)
    """Ids to feed at the next step: one while decoding, more while prefilling, none when idle."""
    last: int | None = None
    """The last sampled id of a finished turn (sampled, not fed yet)."""
    budget: int = 0
    """Most ids its current turn samples."""
    out_ids: list[int] = field(default_factory=list)
    """The ids its current turn sampled so far."""
    out_logprobs: list[float] = field(default_factory=list)
    """Their logprobs."""
    out_versions: list[int] = field(default_factory=list)
    """The weight version that sampled each."""
    constraint: Any = None
    """The current turn's :class:`~llm_gym.policies.constraint.LogitsConstraint` (None: free)."""
    stale: bool = False
    """Its cached keys and values came from older weights: rebuilt at its next turn."""

    @property
    def width(self) -> int:
        """Columns the row holds once its pending ids are fed."""
        return len(self.fed) + len(self.pending)

    @property
    def horizon(self) -> int:
        """Columns the row may hold at the end of its current turn (an idle row: its last
        sampled id fed)."""
        if not self.pending:
            return len(self.fed) + 1
        return self.width + max(0, self.budget - len(self.out_ids) - 1)
