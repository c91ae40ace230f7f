"""On-policy distillation on the multi-turn trainer: its config and its teachers (local or
endpoint)."""
