"""Serving a local model: OpenAI-compatible chat, Responses and legacy completions
(``llm-gym serve``).

Layers, top to bottom: :mod:`.openai_server` (the running server and :func:`serve`), :mod:`.app`
(HTTP: routes, body limits, errors), :mod:`.access` (the hosts and web origins answered, shared
with ``llm-gym serve-env``), :mod:`.streaming` (server-sent events), :mod:`.engine` (the
model, one generation at a time), :mod:`.generation` (sampling and text pieces),
:mod:`.completions` (``/v1/completions``), :mod:`.responses` (chat answer bodies),
:mod:`.responses_api` (``/v1/responses`` answers and events), :mod:`.protocol`,
:mod:`.chat_protocol`, :mod:`.responses_protocol` and :mod:`.body` (request checks).
Starlette and uvicorn (the ``serve`` extra) are imported only when a server starts.
"""

from llm_gym.serving.access import AccessPolicy
from llm_gym.serving.openai_server import (
    DEFAULT_HOST,
    DEFAULT_MAX_TOKENS,
    DEFAULT_PORT,
    MAX_BODY_BYTES,
    ChatCompletionServer,
    serve,
)

__all__ = [
    "AccessPolicy",
    "ChatCompletionServer",
    "serve",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_MAX_TOKENS",
    "MAX_BODY_BYTES",
]
