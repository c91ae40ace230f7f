"""Reusable tools: the safe calculator."""

from llm_gym.tools.arithmetic import format_number, safe_eval
from llm_gym.tools.calculator import CalculatorTool

__all__ = ["CalculatorTool", "format_number", "safe_eval"]
