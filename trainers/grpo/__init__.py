"""Multi-turn GRPO: ``config`` (``GRPOConfig``), ``train`` (``train_multi_turn``), ``trainer`` (the
one trainer class), the pure maths (``advantages``, ``batch``, ``rewards``) and what the trainer
logs (``metrics``, ``health``)."""
