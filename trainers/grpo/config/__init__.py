"""The GRPO config: :class:`MultiTurnGRPOConfig` (the cookbook's ``GRPOConfig``) and what reads it.

One idea per file: ``multi_turn`` holds the dataclass (TRL's ``GRPOConfig`` plus the seeds'
multi-turn fields), ``agent`` the fields that train the user's own agent, ``keep_best`` the
field that keeps the best validation point, ``dtype`` the precision of sampling and training
(and how it combines with ``bf16``), ``field_types`` the type check every config dataclass
runs, ``checks`` the cross-field rules, ``reference`` the generator of ``docs/config.md``.
"""

from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig

GRPOConfig = MultiTurnGRPOConfig

__all__ = ["GRPOConfig", "MultiTurnGRPOConfig"]
