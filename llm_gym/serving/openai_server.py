"""An OpenAI-compatible server (chat, Responses, completions) for a local transformers model.

For tests, demos, distillation teachers and small local runs: a Starlette application on uvicorn
(the ``serve`` extra: ``pip install 'llm-gym[serve]'``) in a background thread, one generation
at a time, any number of connections waiting::

    >>> from llm_gym.serving.openai_server import serve
    >>> from llm_gym.policies.openai import OpenAIPolicy
    >>> with serve("path/to/model") as server:  # doctest: +SKIP
    ...     policy = OpenAIPolicy(model=server.model_name, base_url=server.url)

or from a shell: ``llm-gym serve PATH --port 8000``. For throughput use vLLM or SGLang: same API.

Endpoints:

* ``POST /v1/chat/completions``: the request's messages (and ``tools``) go through the model's own
  chat template with the generation prompt (:mod:`llm_gym.serving.chat_protocol` says what is
  accepted: no client template, allow-listed ``chat_template_kwargs``); the model samples up to
  ``max_tokens`` (or ``max_completion_tokens``; default :data:`DEFAULT_MAX_TOKENS`, never past
  the model's context) with ``temperature`` and ``top_p`` (greedy at 0), ``seed`` seeds the
  request's own sampler (other requests are untouched), and the text ends at an
  end-of-sequence token or a ``stop`` string. With ``tools``, tool calls are parsed out of the
  reply with the server's action format (``tool_parser``; by default the one the model's chat
  template teaches, :func:`~llm_gym.policies.template_format.episode_format`) into
  ``message.tool_calls`` with ``finish_reason`` ``"tool_calls"``. ``logprobs`` /
  ``top_logprobs`` (up to 20) return ``choices[0].logprobs.content``. ``stream=true`` answers
  with server-sent events (:mod:`llm_gym.serving.streaming`).
* ``POST /v1/responses``: the OpenAI Responses API (the OpenAI Agents SDK's default) over the
  same generation: the request is translated into the chat request
  (:mod:`llm_gym.serving.responses_protocol`: ``instructions``, ``input`` items,
  ``function_call`` / ``function_call_output``, function ``tools``, ``text.format``) and the
  answer is a Response object or its event stream (:mod:`llm_gym.serving.responses_api`).
  Nothing is kept: ``previous_response_id`` is refused.
* ``POST /v1/completions`` (:mod:`llm_gym.serving.completions`): ``prompt`` as text or token
  ids, ``echo``, the legacy ``logprobs`` and vLLM's ``prompt_logprobs`` (what a distillation
  teacher, :class:`trainers.distillation.teacher.EndpointTeacher`, reads), ``stream``.
* Token in, token out: both take vLLM's ``return_token_ids`` (``prompt_token_ids`` on the
  answer, ``token_ids`` on the choice).
* ``GET /v1/models``, ``GET /v1/models/{id}``; ``GET /health``: ``{"status": "ok"}``.

Only this machine's clients and web pages are answered unless ``access`` allows more
(:mod:`llm_gym.serving.access`; ``--allowed-hosts`` and ``--allowed-origins`` on the command
line): a ``Host`` that names another host is a 400, a web page of another origin a 403.
Errors come back as ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad request
(the message names the field), 404 for an unknown path or model, 405 for a wrong method, 413
for a body over ``max_body_bytes``, 415 for a body that is not JSON, 408 for a body that
does not arrive within ``request_timeout_s`` (a request head that does not arrive in that time
closes the connection), 503 past ``max_connections``, 500 when generation itself fails
(:mod:`llm_gym.serving.app`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from llm_gym.policies.template_render import DEFAULT_RENDER_DEADLINE_S
from llm_gym.serving.access import AccessPolicy
from llm_gym.serving.app import LOG, MAX_BODY_BYTES, build_app
from llm_gym.serving.body import decode_json_body
from llm_gym.serving.chat_protocol import DEFAULT_CHAT_TEMPLATE_KWARGS, parse_chat_request
from llm_gym.serving.engine import DEFAULT_MAX_TOKENS, Engine
from llm_gym.serving.protocol import parse_completion_request
from llm_gym.serving.recording import Recorder
from llm_gym.serving.responses import dumps
from llm_gym.serving.threaded import (
    ThreadedServer,
    connection_limit,
    head_timeout_protocol,
    http_url,
)

if TYPE_CHECKING:
    from llm_gym.policies.weights import VersionedWeights

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_HEAD_TIMEOUT_S",
    "DEFAULT_HOST",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PORT",
    "MAX_BODY_BYTES",
    "ChatCompletionServer",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
"""Loopback only, unless asked otherwise."""
DEFAULT_PORT = 0
"""0: any free port (read it from :attr:`ChatCompletionServer.port`)."""
DEFAULT_BACKLOG = 2048
"""Connections the kernel queues before the server accepts them (capped by ``somaxconn``)."""
DEFAULT_MAX_CONNECTIONS = 1024
"""Connections and requests at once; past it new requests get a 503 (OpenAI clients retry)."""
DEFAULT_HEAD_TIMEOUT_S = 30.0
"""Seconds a connection may take to send a request's head (and, in :mod:`.app`, its body)."""
"""How long :class:`ChatCompletionServer` waits for the server thread to listen."""

_SERVE_EXTRA = (
    "llm-gym serve needs the serve extra: pip install 'llm-gym[serve]' (starlette, uvicorn)"
)


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def _log_config(uvicorn: Any) -> dict[str, Any]:
    """uvicorn's logging set-up, with :data:`~llm_gym.serving.app.LOG` (why a request was
    refused) written at info level to the access log's stream, next to the request's line."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    stream = config["handlers"]["access"]["stream"]
    config["handlers"][LOG.name] = {
        "formatter": "default",
        "class": "logging.StreamHandler",
        "stream": stream,
    }
    config["loggers"][LOG.name] = {"handlers": [LOG.name], "level": "INFO", "propagate": False}
    return config


class ChatCompletionServer:
    """A running server (see the module docstring); build it with :func:`serve`.

    Args:
        model: A causal LM (``AutoModelForCausalLM``), already on its device.
        tokenizer: Its tokenizer; it must have a chat template.
        host: Interface to listen on.
        port: TCP port (0: any free one).
        model_name: The model id clients send and ``/v1/models`` lists.
        default_max_tokens: Tokens per completion when a request sets none.
        log: Log one line per request (uvicorn's access log), and the reason of each 4xx
            answer at info level (:data:`~llm_gym.serving.app.LOG`).
        tool_parser: The action format that parses tool calls out of replies (``"auto"``: the
            one the chat template teaches, else hermes).
        chat_template_kwargs: The ``chat_template_kwargs`` names clients may set.
        template_tools: A chat template that cannot render tools: ``"fallback"`` (the tools
            as text in the system message) or ``"require"`` (refused).
        max_body_bytes: The largest request body.
        backlog: The listen backlog.
        max_connections: Connections and requests at once (503 past it).
        request_timeout_s: Seconds a client may take to send a request's head, and its body:
            a connection that trickles or stalls is closed (head) or answered 408 (body).
        access: The hosts and web origins answered (default: loopback, and ``host`` when it
            is one address: :meth:`AccessPolicy.local`).
        render_deadline_s: Seconds one render of the chat template may take, at start-up and
            per request (:mod:`llm_gym.policies.template_render`): a template that loops
            stops the start with an error that names it, or answers its request 400 while
            the others are served.
        record: Serve as a training endpoint: True, or a mapping of
            :class:`~llm_gym.serving.recording.Recorder` options (``open_only``,
            ``max_calls``, ...), records every chat and Responses call per episode
            (:attr:`recorder`). False: nothing is kept.
        weights: ``model``'s versioned weights (async training's served replica: each chat
            generation swaps a staged version in first; :class:`~.engine.Engine`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        model_name: str = "model",
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        log: bool = False,
        tool_parser: str = "auto",
        chat_template_kwargs: Collection[str] = DEFAULT_CHAT_TEMPLATE_KWARGS,
        template_tools: str = "fallback",
        max_body_bytes: int = MAX_BODY_BYTES,
        backlog: int = DEFAULT_BACKLOG,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        request_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
        access: AccessPolicy | None = None,
        render_deadline_s: float = DEFAULT_RENDER_DEADLINE_S,
        record: bool | Mapping[str, Any] = False,
        weights: VersionedWeights | None = None,
    ) -> None:
        try:
            import uvicorn
        except ImportError as exc:
            raise ImportError(_SERVE_EXTRA) from exc
        self.engine = Engine(
            model,
            tokenizer,
            model_name=model_name,
            default_max_tokens=default_max_tokens,
            tool_parser=tool_parser,
            chat_template_kwargs=chat_template_kwargs,
            template_tools=template_tools,
            render_deadline_s=render_deadline_s,
            weights=weights,
        )
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.recorder: Recorder | None = None
        """The training endpoint's recorder (``record``), else None."""
        if record:
            options = dict(record) if isinstance(record, Mapping) else {}
            self.recorder = Recorder(self.engine, **options)
        self._closed = False
        self._access = access or AccessPolicy.local(host)
        self._socket = _listen(host, port, backlog)
        try:
            self._start(uvicorn, max_body_bytes, backlog, max_connections, request_timeout_s, log)
        except BaseException:
            self._socket.close()
            raise

    def _start(
        self,
        uvicorn: Any,
        max_body_bytes: int,
        backlog: int,
        max_connections: int,
        timeout_s: float,
        log: bool,
    ) -> None:
        config = uvicorn.Config(
            build_app(
                self.engine,
                max_body_bytes=max_body_bytes,
                body_timeout_s=timeout_s,
                access=self._access,
                recorder=self.recorder,
            ),
            loop="asyncio",
            http=head_timeout_protocol(timeout_s),
            ws="none",
            lifespan="off",
            backlog=backlog,
            limit_concurrency=connection_limit(max_connections),
            timeout_graceful_shutdown=5,
            proxy_headers=False,
            server_header=False,
            access_log=log,
            log_level="info" if log else "warning",
            log_config=_log_config(uvicorn) if log else None,
        )
        self._running = ThreadedServer(config, "llm_gym-serve", sockets=[self._socket])

    # --- the handle ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return str(self._socket.getsockname()[0])

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """The base URL clients use, ``http://HOST:PORT/v1`` (``OpenAIPolicy(base_url=...)``)."""
        return http_url(self.host, self.port, "/v1")

    def wait(self) -> None:
        """Block until :meth:`close` (from another thread) or Ctrl-C."""
        self._running.wait()

    def close(self) -> None:
        """Stop serving (streams in flight get a few seconds) and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._running.stop()
        self.engine.close()
        with contextlib.suppress(OSError):
            self._socket.close()

    def __enter__(self) -> ChatCompletionServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatCompletionServer(model={self.model_name!r}, url={self.url!r})"

    # --- without HTTP (scripts and tests) -----------------------------------------------------

    def chat_completion(self, body: Any) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` body in this thread (no streaming; raises
        :class:`~llm_gym.serving.protocol.APIError` for bad requests)."""
        body = decode_json_body(body if isinstance(body, bytes) else dumps(body))
        request = parse_chat_request(body, self.model_name, self.engine.chat_template_kwargs)
        return self.engine.chat_completion(request)

    def completion(self, body: Any) -> dict[str, Any]:
        """Answer one ``/v1/completions`` body in this thread (see :meth:`chat_completion`)."""
        body = decode_json_body(body if isinstance(body, bytes) else dumps(body))
        return self.engine.completion(parse_completion_request(body, self.model_name))


def serve(
    model_path: str | os.PathLike[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    model_name: str | None = None,
    device: str | None = None,
    dtype: str = "float32",
    chat_template: str | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    log: bool = False,
    **options: Any,
) -> ChatCompletionServer:
    """Load a model directory (or hub id) with ``from_pretrained`` and serve it in the background.

    Args:
        model_path: What ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load.
        host: Interface to listen on (loopback by default).
        port: TCP port (0: any free one; see ``.port`` / ``.url``).
        model_name: The model id clients send (default: ``str(model_path)``).
        device: ``"cpu"``, ``"cuda"``, ... (default: CUDA when available).
        dtype: The torch dtype name to load the weights in.
        chat_template: A named template (``"chatml"``, ``"gemma"``) or a ``.jinja`` file for a
            model without one (:mod:`llm_gym.policies.chat_templates`); a model with none and no
            ``chat_template`` is refused before it is served.
        default_max_tokens: Tokens per completion when a request sets none.
        log: Log one line per request.
        options: More :class:`ChatCompletionServer` arguments (``tool_parser``,
            ``template_tools``, ``chat_template_kwargs``, ``max_body_bytes``, ``backlog``,
            ``max_connections``, ``request_timeout_s``, ``access``, ``render_deadline_s``).

    Returns:
        The running server: ``.url`` is the base URL (``http://HOST:PORT/v1``), ``.close()``
        stops it; it is also a context manager.
    """
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(_SERVE_EXTRA) from exc
    from llm_gym.policies.loading import load_for_generation

    model, tokenizer = load_for_generation(
        model_path, dtype=dtype, device=device, chat_template=chat_template
    )
    return ChatCompletionServer(
        model,
        tokenizer,
        host=host,
        port=port,
        model_name=model_name or str(model_path),
        default_max_tokens=default_max_tokens,
        log=log,
        **options,
    )
