"""Serving a local model: OpenAI-compatible chat and legacy completions (``llm-gym serve``)."""

from llm_gym.serving.openai_server import (
    DEFAULT_HOST,
    DEFAULT_MAX_TOKENS,
    DEFAULT_PORT,
    MAX_BODY_BYTES,
    ChatCompletionServer,
    serve,
)

__all__ = [
    "ChatCompletionServer",
    "serve",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_MAX_TOKENS",
    "MAX_BODY_BYTES",
]
