"""Message and tool spec types (the seeds import them from ``...types``)."""

from llm_gym.core.types import FunctionCall, FunctionSpec, JsonSchema, Message, ToolCall, ToolSpec

__all__ = ["FunctionCall", "FunctionSpec", "JsonSchema", "Message", "ToolCall", "ToolSpec"]
