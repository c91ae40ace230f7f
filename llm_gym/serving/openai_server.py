"""A minimal OpenAI-compatible server (chat and legacy completions) for a local transformers model.

For tests, demos and small local runs: the standard library's ``ThreadingHTTPServer`` in a
background thread, one ``generate`` at a time (a lock), no extra package beyond the training stack
(torch, transformers)::

    >>> from llm_gym.serving.openai_server import serve
    >>> from llm_gym.policies.openai import OpenAIPolicy
    >>> with serve("path/to/model") as server:  # doctest: +SKIP
    ...     policy = OpenAIPolicy(model=server.model_name, base_url=server.url)

or from a shell: ``llm-gym serve PATH --port 8000``. For throughput use vLLM or SGLang: same API.

Endpoints:

* ``POST /v1/chat/completions`` (non-streaming): the request's messages (and ``tools``, when
  given) go through the tokenizer's chat template with the generation prompt; the model samples
  up to ``max_tokens`` (or ``max_completion_tokens``; default :data:`DEFAULT_MAX_TOKENS`, never
  past the model's context) with ``temperature`` and ``top_p`` (greedy when ``temperature`` is 0)
  and stops at an end-of-sequence token or a ``stop`` string. ``seed`` reseeds torch before the
  generation. The answer's ``message.content`` is the model's raw text (special tokens skipped):
  tool calls are *not* parsed out of it, clients parse them with their own action format, as
  :class:`~llm_gym.policies.openai.OpenAIPolicy` does. ``finish_reason`` is ``"stop"`` or
  ``"length"``; ``usage`` counts prompt and completion tokens.
* ``POST /v1/completions`` (non-streaming; :mod:`llm_gym.serving.completions`): ``prompt`` as
  text or token ids, ``max_tokens`` (0 with ``echo``: score the prompt only), ``echo``,
  ``temperature``, ``top_p``, ``seed``; the legacy ``logprobs`` object (``logprobs``: 0..5) and
  vLLM's ``prompt_logprobs`` (0..5), what a distillation teacher
  (:class:`trainers.teacher.EndpointTeacher`) reads. A token id outside the vocabulary or a
  prompt longer than the context is a 400 naming ``prompt``.
* ``GET /v1/models``: the one model served; ``GET /health``: ``{"status": "ok"}``.

Errors come back as ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad request
(the message names the field), 404 for an unknown path or model, 405 for a wrong method, 413 for
a body over :data:`MAX_BODY_BYTES`, 500 when generation itself fails. Unknown request fields are
ignored; ``stream=true`` and ``n`` other than 1 are refused (:mod:`llm_gym.serving.protocol`
checks the requests).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.completions import text_completion
from llm_gym.serving.protocol import (
    APIError,
    bad_request,
    completion_body,
    parse_chat_request,
    parse_completion_request,
)

__all__ = [
    "DEFAULT_HOST",
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
DEFAULT_MAX_TOKENS = 256
"""Tokens per completion when a request sets no ``max_tokens``."""
MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body accepted."""


class ChatCompletionServer:
    """A running server (see the module docstring); build it with :func:`serve`.

    Args:
        model: A causal LM (``AutoModelForCausalLM``), already on its device.
        tokenizer: Its tokenizer; it must have a chat template.
        host: Interface to listen on.
        port: TCP port (0: any free one).
        model_name: The model id clients send and ``/v1/models`` lists.
        default_max_tokens: Tokens per completion when a request sets none.
        log: Print one line per request to stderr.
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
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidArgumentError(
                "The tokenizer has no chat template; the server renders every request with it. "
                "Set tokenizer.chat_template (or save a model directory that has one)."
            )
        if default_max_tokens < 1:
            raise InvalidArgumentError(
                f"default_max_tokens must be >= 1, actual value: {default_max_tokens}."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.log = log
        self.created = int(time.time())
        self.requests = 0
        self._generate_lock = threading.Lock()
        self._eos_ids = self._find_eos_ids()
        self._context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="llm_gym-serve",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    # --- the handle ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL clients use, ``http://HOST:PORT/v1`` (``OpenAIPolicy(base_url=...)``)."""
        host = self.host
        if ":" in host:  # IPv6
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    def wait(self) -> None:
        """Block until :meth:`close` (from another thread) or Ctrl-C."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> ChatCompletionServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatCompletionServer(model={self.model_name!r}, url={self.url!r})"

    # --- the work -----------------------------------------------------------------------------

    def _find_eos_ids(self) -> list[int]:
        ids: set[int] = set()
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif isinstance(configured, list | tuple):
            ids.update(int(i) for i in configured)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return sorted(ids)

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "llm_gym",
                }
            ],
        }

    def chat_completion(self, body: Any) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` body (raises :class:`APIError` for bad requests)."""
        request = parse_chat_request(body, self.model_name)
        try:
            prompt = self.tokenizer.apply_chat_template(
                request.messages,
                tools=request.tools or None,
                tokenize=False,
                add_generation_prompt=True,
                **request.chat_template_kwargs,
            )
        except Exception as exc:  # a template that rejects these messages
            raise bad_request(
                f"the chat template rejected the messages: {exc}", "messages"
            ) from exc
        prompt_ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        budget = request.max_tokens or self.default_max_tokens
        if self._context is not None:
            if len(prompt_ids) >= self._context:
                raise bad_request(
                    f"the prompt is {len(prompt_ids)} tokens; the model's context is "
                    f"{self._context} tokens",
                    "messages",
                )
            budget = min(budget, self._context - len(prompt_ids))
        ids = self._generate(prompt_ids, budget, request.temperature, request.top_p, request.seed)

        finish = "length"
        if ids and ids[-1] in self._eos_ids:
            ids, finish = ids[:-1], "stop"
            completion_tokens = len(ids) + 1
        else:
            completion_tokens = len(ids)
        text = self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        cuts = [i for i in (text.find(s) for s in request.stops) if i != -1]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        return completion_body(self.model_name, text, finish, len(prompt_ids), completion_tokens)

    def completion(self, body: Any) -> dict[str, Any]:
        """Answer one ``/v1/completions`` body (raises :class:`APIError` for bad requests)."""
        return text_completion(
            parse_completion_request(body, self.model_name),
            model=self.model,
            tokenizer=self.tokenizer,
            model_name=self.model_name,
            context=self._context,
            default_max_tokens=self.default_max_tokens,
            eos_ids=self._eos_ids,
            generate=self._generate,
            lock=self._generate_lock,
        )

    def _generate(
        self, prompt_ids: list[int], budget: int, temperature: float, top_p: float, seed: int | None
    ) -> list[int]:
        import torch

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self._eos_ids[0] if self._eos_ids else 0
        greedy = temperature == 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": budget,
            "do_sample": not greedy,
            "pad_token_id": pad,
            "eos_token_id": self._eos_ids or None,
        }
        if not greedy:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        with self._generate_lock:
            if seed is not None:
                torch.manual_seed(seed)
            with torch.inference_mode():
                output = self.model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
                )
        ids = output[0, len(prompt_ids) :].tolist()
        for position, token in enumerate(ids):  # stop at the first end of sequence
            if token in self._eos_ids:
                return ids[: position + 1]
        return ids

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self
        routes: dict[tuple[str, str], Callable[[Any], dict[str, Any]]] = {
            ("POST", "/v1/chat/completions"): server.chat_completion,
            ("POST", "/v1/completions"): server.completion,
            ("GET", "/v1/models"): lambda _: server.models(),
            ("GET", "/health"): lambda _: {"status": "ok"},
        }
        paths = {path for _, path in routes}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "llm_gym-serve"

            def log_message(self, format: str, *args: Any) -> None:
                if server.log:
                    sys.stderr.write(f"[llm_gym.serve] {self.address_string()} {format % args}\n")

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _read_body(self) -> Any:
                length = self.headers.get("Content-Length")
                if length is None:
                    raise APIError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
                try:
                    size = int(length)
                except ValueError as exc:
                    raise bad_request(f"bad Content-Length {length!r}") from exc
                if size > MAX_BODY_BYTES:
                    self.close_connection = True
                    raise APIError(
                        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"the body is {size} bytes; the limit is {MAX_BODY_BYTES}",
                    )
                raw = self.rfile.read(size)
                try:
                    return json.loads(raw)
                except ValueError as exc:
                    raise bad_request(f"the body is not valid JSON: {exc}") from exc

            def _handle(self, method: str) -> None:
                server.requests += 1
                path = self.path.split("?", 1)[0].rstrip("/") or "/"
                try:
                    route = routes.get((method, path))
                    if route is None:
                        if path in paths:
                            raise APIError(
                                HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}"
                            )
                        raise APIError(
                            HTTPStatus.NOT_FOUND,
                            f"no such endpoint {method} {path}; this server has POST "
                            "/v1/chat/completions, POST /v1/completions, GET /v1/models and "
                            "GET /health",
                            code="not_found",
                        )
                    body = self._read_body() if method == "POST" else None
                    self._send(HTTPStatus.OK, route(body))
                except APIError as exc:
                    self._send(exc.status, exc.body())
                except Exception as exc:  # generation failed: the client sees why
                    error = APIError(
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"internal error: {type(exc).__name__}: {exc}",
                        kind="server_error",
                    )
                    self._send(error.status, error.body())

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        return Handler


def serve(
    model_path: str | os.PathLike[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    model_name: str | None = None,
    device: str | None = None,
    dtype: str = "float32",
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    log: bool = False,
) -> ChatCompletionServer:
    """Load a model directory (or hub id) with ``from_pretrained`` and serve it in the background.

    Args:
        model_path: What ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load.
        host: Interface to listen on (loopback by default).
        port: TCP port (0: any free one; see ``.port`` / ``.url``).
        model_name: The model id clients send (default: ``str(model_path)``).
        device: ``"cpu"``, ``"cuda"``, ... (default: CUDA when available).
        dtype: The torch dtype name to load the weights in.
        default_max_tokens: Tokens per completion when a request sets none.
        log: Print one line per request to stderr.

    Returns:
        The running server: ``.url`` is the base URL (``http://HOST:PORT/v1``), ``.close()``
        stops it; it is also a context manager.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not hasattr(torch, dtype):
        raise InvalidArgumentError(f"dtype must name a torch dtype, actual value: {dtype!r}.")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    return ChatCompletionServer(
        model,
        tokenizer,
        host=host,
        port=port,
        model_name=model_name or str(model_path),
        default_max_tokens=default_max_tokens,
        log=log,
    )
