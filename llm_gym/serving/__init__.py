"""Serving a local model: an OpenAI-compatible chat-completions endpoint (``llm-gym serve``)."""

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
