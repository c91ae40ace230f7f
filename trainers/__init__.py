"""Multi-turn GRPO training on TRL (see the trainer issue); requires the ``train`` extra."""
