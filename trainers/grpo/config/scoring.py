"""The fields of :class:`~trainers.grpo.config.multi_turn.MultiTurnGRPOConfig` that choose how
the loss's forward scores a micro-batch: its shared prefix once, its token tree, its silent rows
left out. Each keeps the loss and its gradients; each only removes work."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ScoringFields"]


@dataclass
class ScoringFields:
    """``shared_prefix``, ``token_tree`` and ``skip_silent_rows`` (a base of the trainer's
    config; :mod:`trainers.grpo.scoring`)."""

    shared_prefix: bool = field(
        default=True,
        metadata={
            "help": "Score the tokens every row starts with (system prompt, tool specs) once "
            "per micro-batch instead of once per row: same loss and gradients, fewer FLOPs."
        },
    )
    token_tree: bool = field(
        default=True,
        metadata={
            "help": "Score each micro-batch as the token tree of its rows (with shared_prefix): "
            "every distinct prefix (a group's question, a shared first turn) runs once, and the "
            "LM head runs only where a completion token is scored. Same loss and gradients."
        },
    )
    token_tree_row_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per packed row of the token tree, at least the longest row's (longer: "
            "fewer tokens run twice, more attention). None: per micro-batch, of 1, 2, 4 and 8 "
            "times the longest row's, the one of least modelled FLOPs (trainers.grpo.token_tree)."
        },
    )
    skip_silent_rows: bool = field(
        default=True,
        metadata={
            "help": "Leave rows with all-zero advantages out of the passes where that keeps the "
            "loss and gradients (dapo/cispo, beta 0, no entropy mask/bonus, no distillation)."
        },
    )
    shared_prefix_min_length: int = field(
        default=32,
        metadata={"help": "The shortest shared prefix worth its own forward pass (tokens)."},
    )
