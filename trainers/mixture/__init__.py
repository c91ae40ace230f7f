"""A weighted mixture of environments in one run: its records, its draw, its config and SFT warm
start."""
