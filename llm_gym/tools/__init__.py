"""Reusable tools: the safe calculator."""

from llm_gym.tools.calculator import CalculatorTool, format_number, safe_eval

__all__ = ["CalculatorTool", "format_number", "safe_eval"]
