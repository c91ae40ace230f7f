"""Multi-turn SFT: the warm start before GRPO and ``llm-gym sft`` on saved episodes."""
