"""The model side of :mod:`llm_gym.serving`: one model, one generation at a time.

:class:`Engine` holds the model and its tokenizer and does the work of every endpoint: it renders
a chat request with the model's own chat template, checks the prompt against the context,
samples (:mod:`llm_gym.serving.generation`) and writes the answer
(:mod:`llm_gym.serving.responses`). Every method that touches the model runs in the engine's one
worker thread (:meth:`Engine.submit`), so generations never overlap, while the web server's event
loop keeps accepting and answering connections. A chat request's prompt is rendered before, in
a small pool of its own (:meth:`Engine.render`), each render stopped at ``render_deadline_s``
(:mod:`llm_gym.policies.template_render`): a model's template that loops on one request's
words costs that request a 400 and holds no other request, nor the model thread. Its methods
raise :class:`~llm_gym.serving.protocol.APIError` for what the client got wrong.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies.chat import template_input, untrusted_kwargs
from llm_gym.policies.chat_templates import require_chat_template
from llm_gym.policies.template_format import episode_format
from llm_gym.policies.template_render import (
    DEFAULT_RENDER_DEADLINE_S,
    TemplateTimeoutError,
    apply_template,
    render_deadline,
)
from llm_gym.policies.template_tools import PROBE_SPEC, layout_for
from llm_gym.serving.chat_protocol import (
    DEFAULT_CHAT_TEMPLATE_KWARGS,
    ChatRequest,
    check_template_kwargs_allowlist,
)
from llm_gym.serving.completions import encode_within, text_completion
from llm_gym.serving.generation import (
    Piece,
    Sampling,
    TextAssembler,
    TokenOut,
    TokenText,
    sample_tokens,
)
from llm_gym.serving.grammars import chat_grammar
from llm_gym.serving.protocol import APIError, CompletionRequest, bad_request
from llm_gym.serving.responses import assistant_message, chat_body, logprobs_content

if TYPE_CHECKING:
    from llm_gym.policies.constraint import GrammarCompiler
    from llm_gym.policies.weights import VersionedWeights

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_MAX_TOKENS_LIMIT", "ClientGone", "Engine"]

DEFAULT_MAX_TOKENS = 256
"""Tokens per completion when a request sets no ``max_tokens``."""
DEFAULT_MAX_TOKENS_LIMIT = 4096
"""The most tokens one completion may have when the model's context length is unknown."""
RENDER_THREADS = 4
"""Threads that render chat prompts (the model's thread only generates)."""
GRAMMAR_CACHE = 64
"""Distinct reply grammars kept built (tools, tool_choice and response_format)."""

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before its answer was ready: nobody reads it."""


def _check_cancelled(cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise ClientGone


class Engine:
    """A model and its tokenizer behind a one-thread executor (see the module docstring).

    Args:
        model: A causal LM (``AutoModelForCausalLM``), already on its device.
        tokenizer: Its tokenizer; it must have a chat template.
        model_name: The model id clients send.
        default_max_tokens: Tokens per completion when a request sets none.
        tool_parser: The action format (:func:`llm_gym.actions.get_action_format`) that parses
            tool calls out of replies to requests with ``tools``; it also writes the tools
            into the system message when the chat template cannot render them
            (:mod:`llm_gym.policies.template_tools`). ``"auto"``: the one the chat template
            teaches, else hermes (:func:`~llm_gym.policies.template_format.episode_format`).
        chat_template_kwargs: The ``chat_template_kwargs`` names clients may set.
        template_tools: ``"fallback"`` (a template that cannot render tools gets them as text)
            or ``"require"`` (such a template is refused here).
        render_deadline_s: Seconds one render of the chat template may take, at start-up (the
            probes of :mod:`llm_gym.policies.template_tools`) and per request.
        weights: ``model``'s versioned weights (async training's served replica): a chat
            generation first swaps a staged version in (``lock`` is their ``in_use``), and
            each token it samples records its version (``TokenOut.version``).

    Raises:
        TemplateTimeoutError: the chat template's probes ran past ``render_deadline_s``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "model",
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        tool_parser: str = "auto",
        chat_template_kwargs: Collection[str] = DEFAULT_CHAT_TEMPLATE_KWARGS,
        template_tools: str = "fallback",
        render_deadline_s: float = DEFAULT_RENDER_DEADLINE_S,
        weights: VersionedWeights | None = None,
    ) -> None:
        require_chat_template(tokenizer, model, what=f"model {model_name!r}")  # the remedy named
        if isinstance(default_max_tokens, bool) or default_max_tokens < 1:
            raise InvalidArgumentError(
                f"default_max_tokens must be >= 1, actual value: {default_max_tokens}."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.default_max_tokens = int(default_max_tokens)
        if not render_deadline_s > 0:
            raise InvalidArgumentError(
                f"render_deadline_s must be > 0, actual value: {render_deadline_s!r}."
            )
        self.render_deadline_s = float(render_deadline_s)
        with render_deadline(self.render_deadline_s):  # probes: a template that loops stops
            self.action_format = episode_format(
                tool_parser, tokenizer, template_tools=template_tools
            )
            layout_for(  # refused here under "require"; the text layout warns once here
                tokenizer,
                [PROBE_SPEC],
                template_tools=template_tools,
                action_format=self.action_format,
            )
        self.chat_template_kwargs = check_template_kwargs_allowlist(chat_template_kwargs)
        self.created = int(time.time())
        self.max_tokens_limit = DEFAULT_MAX_TOKENS_LIMIT
        """The most tokens one completion may have when the context length is unknown."""
        self.lock_grammars = threading.Lock()
        self._grammars: dict[str, str | None] = {}
        self.weights = weights
        self.lock = threading.Lock() if weights is None else weights.in_use
        """Held around every model call (the worker thread is the only caller; kept for
        :func:`~llm_gym.serving.completions.text_completion`'s scoring)."""
        self.eos_ids = self._find_eos_ids()
        self.context: int | None = getattr(
            getattr(model, "config", None), "max_position_embeddings", None
        )
        self.token_text = TokenText(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0))
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "llm_gym-serve-model")
        self._renderer = concurrent.futures.ThreadPoolExecutor(
            RENDER_THREADS, "llm_gym-serve-render"
        )

    def _find_eos_ids(self) -> list[int]:
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        configured = [configured] if isinstance(configured, int) else configured
        ids = {int(i) for i in configured} if isinstance(configured, list | tuple) else set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return sorted(ids)

    # --- the worker thread -------------------------------------------------------------------

    def submit(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``function(*args)`` in the model's worker thread, after the work queued before
        (call it from the event loop; await the future for the result)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def render(self, request: ChatRequest) -> list[int]:
        """:meth:`chat_prompt` in the render pool (call it from the event loop): a render that
        runs to its deadline holds one render thread, never the model's; then the reply's
        grammar is built and checked there too (:meth:`chat_grammar`)."""
        prompt = await asyncio.get_running_loop().run_in_executor(
            self._renderer, self.chat_prompt, request
        )
        await asyncio.get_running_loop().run_in_executor(self._renderer, self.chat_grammar, request)
        return prompt

    async def in_render_pool(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the render pool (call it from the event loop): prompt work
        that must not hold the model's thread (:mod:`llm_gym.serving.recording`'s)."""
        return await asyncio.get_running_loop().run_in_executor(self._renderer, function, *args)

    def close(self) -> None:
        """Drop the queued work and stop the worker once the running generation ends."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._renderer.shutdown(wait=False, cancel_futures=True)

    # --- prompts ------------------------------------------------------------------------------

    def budget(self, prompt_tokens: int, requested: int | None, field: str) -> int:
        """Tokens the completion may have: ``requested`` (or the default), within the context."""
        budget = requested or self.default_max_tokens
        if self.context is None:
            return min(budget, self.max_tokens_limit)
        if prompt_tokens >= self.context:
            raise bad_request(
                f"the prompt is {prompt_tokens} tokens; the model's context is {self.context} "
                "tokens (and one must be left to generate)",
                field,
            )
        return min(budget, self.context - prompt_tokens)

    def chat_prompt(self, request: ChatRequest) -> list[int]:
        """The prompt's token ids: the messages (and tools) through the model's chat template.

        A request of more messages and tools than the context has tokens is refused before the
        template renders it (each renders to a token at least; 200,000 one-letter messages took
        the template 4 s)."""
        count = len(request.messages) + len(request.tools or ())
        if self.context is not None and count > self.context:
            raise bad_request(
                f"{len(request.messages):,} messages and {len(request.tools or ()):,} tools "
                f"cannot fit the model's context of {self.context} tokens (each takes a token "
                "at least)",
                "messages",
            )
        try:
            with render_deadline(self.render_deadline_s):  # and probes of new template kwargs
                prompt = self._render_prompt(request)
        except TemplateTimeoutError as exc:
            raise bad_request(str(exc), "messages") from None
        return encode_within(self.tokenizer, prompt, self.context, "messages")

    def _render_prompt(self, request: ChatRequest) -> str:
        try:  # a template that cannot render tools gets them as text in the system message
            messages, tools = template_input(
                self.tokenizer,
                request.messages,
                request.tools or None,
                action_format=self.action_format,
                chat_template_kwargs=request.chat_template_kwargs,
                raw_assistant=False,
            )
        except TemplateTimeoutError:
            raise
        except (LlmGymError, TypeError, ValueError) as exc:
            raise bad_request(
                f"the conversation could not be written in the {self.action_format.name!r} "
                f"format for this model's chat template: {exc}"[:2000],
                "messages",
            ) from None
        try:  # a client's template options reach the prompt too: neutralised alike
            return apply_template(
                self.tokenizer,
                messages,
                tools=tools,
                add_generation_prompt=True,
                template_kwargs=untrusted_kwargs(self.tokenizer, request.chat_template_kwargs),
                deadline_s=self.render_deadline_s,
            )
        except TemplateTimeoutError:
            raise
        except Exception as exc:  # a template that rejects these messages (raise_exception, ...)
            raise bad_request(
                f"the chat template rejected the messages: {type(exc).__name__}: {exc}"[:2000],
                "messages",
            ) from None

    # --- generation ---------------------------------------------------------------------------

    def run(
        self,
        prompt_ids: Sequence[int],
        sampling: Sampling,
        assembler: TextAssembler,
        on_piece: Callable[[Piece], None],
        cancelled: Callable[[], bool] = lambda: False,
        seen: list[TokenOut] | None = None,
    ) -> None:
        """Sample, feeding each token to ``assembler`` and each non-empty piece to ``on_piece``
        (the last one after the generation); stops early on a stop string or ``cancelled()``.
        ``seen``, when given, gets every sampled token in order (the end-of-sequence one too)."""

        def on_token(token: TokenOut) -> bool:
            if seen is not None:
                seen.append(token if version < 0 else dataclasses.replace(token, version=version))
            piece = assembler.feed(token)
            if piece is not None and (piece.text or piece.tokens):
                on_piece(piece)
            return assembler.finish is not None or cancelled()

        version = -1
        if sampling.max_tokens > 0 and not cancelled():
            with self.lock:
                version = -1 if self.weights is None else self.weights.take_latest()
                sample_tokens(
                    self.model,
                    prompt_ids,
                    sampling,
                    eos_ids=self.eos_ids,
                    pad_id=self.pad_id,
                    on_token=on_token,
                )
        if sampling.keep_complete and assembler.finish is None and not cancelled():
            kept = sampling.constraint.complete_prefix(assembler.generated)
            if kept is not None:
                assembler.rewind(kept)
        last = assembler.flush()
        if last.text or last.tokens:
            on_piece(last)

    def generate(
        self, prompt_ids: list[int], budget: int, temperature: float, top_p: float, seed: int | None
    ) -> list[int]:
        """New token ids, up to and including an end-of-sequence token (what
        :func:`~llm_gym.serving.completions.text_completion` calls)."""
        ids: list[int] = []

        def on_token(token: TokenOut) -> bool:
            ids.append(token.token_id)
            return token.token_id in self.eos_ids

        with self.lock:
            sample_tokens(
                self.model,
                prompt_ids,
                Sampling(budget, temperature, top_p, seed),
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                on_token=on_token,
            )
        return ids

    def chat_sampling(self, request: ChatRequest, prompt_tokens: int) -> Sampling:
        grammar = self.chat_grammar(request)
        return Sampling(
            max_tokens=self.budget(prompt_tokens, request.max_tokens, "messages"),
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            logprobs=request.top_logprobs if request.logprobs else None,
            constraint=None if grammar is None else self._compiler().constraint(grammar),
            keep_complete=grammar is not None and request.tool_choice.forced,
        )

    def _compiler(self) -> GrammarCompiler:
        from llm_gym.policies.constraint import MissingGrammarLibraryError, compiler_for

        width = self.model.get_output_embeddings().weight.shape[0]
        try:
            return compiler_for(self.tokenizer, width, self.eos_ids)
        except MissingGrammarLibraryError as exc:
            raise APIError(501, str(exc), kind="server_error") from None

    def chat_grammar(self, request: ChatRequest) -> str | None:
        """The grammar ``request``'s reply follows (:mod:`llm_gym.policies.constraint`), or
        None; built once per distinct ``tools`` / ``tool_choice`` / ``response_format``.

        Raises:
            APIError: 400 naming the field whose schema or choice cannot be enforced.
        """
        key = json.dumps(
            [
                request.tools or [],
                request.tool_choice.mode,
                request.tool_choice.name,
                request.parallel_tool_calls,
                request.answer_schema,
            ],
            sort_keys=True,
        )
        with self.lock_grammars:
            if key in self._grammars:
                return self._grammars[key]
        grammar = chat_grammar(self._compiler(), self.action_format, request)
        with self.lock_grammars:
            self._grammars[key] = grammar
            while len(self._grammars) > GRAMMAR_CACHE:
                self._grammars.pop(next(iter(self._grammars)))
        return grammar

    def chat_completion(
        self,
        request: ChatRequest,
        cancelled: Callable[[], bool] = lambda: False,
        prompt_ids: list[int] | None = None,
        seen: list[TokenOut] | None = None,
    ) -> dict[str, Any]:
        """Answer a checked, non-streamed chat request (in the worker thread) from its
        ``prompt_ids`` (:meth:`render`; None: rendered here); ``cancelled()`` true (the client
        left) skips or stops the generation; ``seen`` gets every sampled token
        (:meth:`run`)."""
        _check_cancelled(cancelled)
        if prompt_ids is None:
            prompt_ids = self.chat_prompt(request)
        sampling = self.chat_sampling(request, len(prompt_ids))
        assembler = TextAssembler(
            self.tokenizer, self.eos_ids, request.stops, keep_special=request.parse_tool_calls
        )
        pieces: list[Piece] = []
        self.run(prompt_ids, sampling, assembler, pieces.append, cancelled, seen)
        _check_cancelled(cancelled)
        text = assembler.text
        tools = self.action_format if request.parse_tool_calls else None
        finish = assembler.finish or "length"
        message, finish = assistant_message(
            text,
            finish,
            tools,
            parallel=request.parallel_tool_calls,
            tool_names=request.tool_names,
        )
        logprobs = None
        if request.logprobs:
            tokens = [t for p in pieces for t in p.tokens][: len(assembler.ids)]
            logprobs = logprobs_content(tokens, request.top_logprobs, self.token_text)
        return chat_body(
            self.model_name,
            message,
            finish,
            len(prompt_ids),
            len(assembler.generated),
            logprobs=logprobs,
            token_ids=(prompt_ids, assembler.generated) if request.return_token_ids else None,
        )

    def completion(
        self, request: CompletionRequest, cancelled: Callable[[], bool] = lambda: False
    ) -> dict[str, Any]:
        """Answer a checked, non-streamed ``/v1/completions`` request (in the worker thread);
        skipped when ``cancelled()`` is already true."""
        _check_cancelled(cancelled)
        return text_completion(
            request,
            model=self.model,
            tokenizer=self.tokenizer,
            model_name=self.model_name,
            context=self.context,
            default_max_tokens=self.default_max_tokens,
            eos_ids=self.eos_ids,
            generate=self.generate,
            lock=self.lock,
            token_text=self.token_text,
            max_tokens_limit=self.max_tokens_limit,
        )
