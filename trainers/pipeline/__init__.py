"""The recipe behind ``train.py``: its config files, the SFT warm start, GRPO and the
evaluations."""
