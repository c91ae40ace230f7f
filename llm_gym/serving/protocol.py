"""The OpenAI protocol as :mod:`llm_gym.serving` reads it: errors, shared field checks, completions.

:class:`APIError` is every error answer (``{"error": {"message", "type", "param", "code"}}``).
The field checks here (:func:`number_field`, :func:`int_field`, :func:`flag_field`, ...) are the
ones every endpoint shares; each refuses a value with a 400 that names the field, says what is
allowed and what came. :func:`check_common` checks what every generation request carries
(``model``, ``n``, ``stream``, ``stream_options``, ``seed``, and the known sampling fields this
server cannot honour, :data:`UNHONOURED_FIELDS`); :func:`parse_completion_request`
turns a ``/v1/completions`` body into a :class:`CompletionRequest`. The chat endpoint's request is
in :mod:`llm_gym.serving.chat_protocol`. Bodies reach these functions already decoded and checked
for depth and lone surrogates (:mod:`llm_gym.serving.body`). What needs the model (token ids in
its vocabulary, the context length) is checked by the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

__all__ = [
    "MAX_LOGPROBS",
    "MAX_SEED",
    "CHAT_UNHONOURED_FIELDS",
    "MIN_SEED",
    "STREAM_OPTIONS",
    "UNHONOURED_FIELDS",
    "APIError",
    "Common",
    "CompletionRequest",
    "bad_request",
    "check_common",
    "flag_field",
    "int_field",
    "number_field",
    "parse_completion_request",
    "refuse_unhonoured",
]

MAX_LOGPROBS = 5
"""The most alternatives ``logprobs`` / ``prompt_logprobs`` of ``/v1/completions`` may ask for."""
MIN_SEED = -(2**63)
"""The smallest ``seed`` (an int64, as OpenAI's API types it)."""
MAX_SEED = 2**64 - 1
"""The largest ``seed`` (what the sampler's generator takes)."""

UNHONOURED_FIELDS: dict[str, tuple[Any, ...]] = {
    # OpenAI's
    "logit_bias": ({},),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "best_of": (1,),
    "suffix": ("",),
    # vLLM's sampling extras
    "top_k": (0, -1),
    "min_p": (0,),
    "repetition_penalty": (1,),
    "length_penalty": (1,),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "use_beam_search": (False,),
    "skip_special_tokens": (True,),
    "bad_words": ([],),
    "stop_token_ids": ([],),
    "allowed_token_ids": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
}
"""Known request fields (OpenAI's, vLLM's) that would change the answer and that this server
does not implement, with the values that change nothing (null always does). Any other value is
refused with a 400 rather than dropped: a client that bans a token with ``logit_bias`` must not
get it back silently."""


CHAT_UNHONOURED_FIELDS: dict[str, tuple[Any, ...]] = {
    **{"modalities": (["text"],), "audio": (), "web_search_options": (), "reasoning_effort": ()},
    **{"verbosity": ("medium",), "functions": ([],), "function_call": ("auto", "none")},
    "moderation": (),
    **{"echo": (False,), "prompt_logprobs": ()},  # vLLM's
}
"""Chat fields (beside :data:`~llm_gym.serving.protocol.UNHONOURED_FIELDS`) this server does not
implement, with the values that change nothing: its replies are text, it searches and moderates
nothing, has one verbosity and does not reason on a budget (OpenAI refuses ``reasoning_effort``
for a model that does not); the deprecated ``functions`` are ``tools``."""


class APIError(Exception):
    """An error answer: its HTTP status and the OpenAI-style error body.

    Args:
        status: The HTTP status.
        message: What went wrong (names the field when one is at fault).
        param: The request field at fault, if any.
        kind: The error ``type`` (``invalid_request_error``, ``server_error``, ...).
        code: A machine-readable code (``model_not_found``, ...), if any.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 :class:`APIError` about ``param``."""
    return APIError(HTTPStatus.BAD_REQUEST, message, param)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def number_field(
    body: dict[str, Any],
    key: str,
    default: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
) -> float:
    """``body[key]`` as a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``).

    Example:
        >>> number_field({"top_p": 0.5}, "top_p", 1.0, 0.0, 1.0, low_open=True)
        0.5
        >>> number_field({}, "top_p", 1.0, 0.0, 1.0)
        1.0
    """
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and isinstance(value, int) and abs(value) > 2**53:
        ok = False  # an integer no float holds exactly is never a sensible setting here
    if ok:
        value = float(value)
        ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise bad_request(
            f"'{key}' must be a number in {bracket}{low:g}, {high:g}]; got {_show(body[key])}", key
        )
    return value


def int_field(
    body: dict[str, Any], key: str, low: int, high: int | None = None, what: str = ""
) -> int | None:
    """``body[key]`` as an integer in ``[low, high]`` (``None`` when absent or null)."""
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise bad_request(f"'{key}' must be {allowed}{what}; got {_show(value)}", key)
    return value


def flag_field(body: dict[str, Any], key: str, default: bool = False) -> bool:
    """``body[key]`` as ``true``/``false`` (``default`` when absent or null)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be true or false; got {_show(value)}", key)
    return value


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``allowed`` (``True`` is not ``1``, nor ``0`` ``False``)."""
    return any(
        isinstance(value, bool) == isinstance(item, bool)
        and isinstance(value, int | float) == isinstance(item, int | float)
        and value == item
        for item in allowed
    )


def refuse_unhonoured(body: dict[str, Any], fields: dict[str, tuple[Any, ...]]) -> None:
    """Refuse each of ``fields`` (name: the values that change nothing) set to anything else.

    Raises:
        APIError: 400 naming the field and the values accepted.

    Example:
        >>> refuse_unhonoured({"top_k": -1, "logit_bias": {}}, UNHONOURED_FIELDS)
        >>> refuse_unhonoured({"logit_bias": {"50256": -100}}, UNHONOURED_FIELDS)
        Traceback (most recent call last):
        ...
        llm_gym.serving.protocol.APIError: 'logit_bias' is not supported by this server (it would be ignored); omit it or send null or {}; got {'50256': -100}
    """  # noqa: E501
    for key, allowed in fields.items():
        value = body.get(key)
        if value is not None and not _neutral(value, allowed):
            accepted = " or ".join(["null", *(json.dumps(v) for v in allowed)])
            raise bad_request(
                f"'{key}' is not supported by this server (it would be ignored); omit it or send "
                f"{accepted}; got {_show(value)}",
                key,
            )


STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")
"""The ``stream_options`` fields read: OpenAI's ``include_usage`` (honoured) and
``include_obfuscation`` (accepted either way: no stream of this server carries OpenAI's
``obfuscation`` padding, which hides the length of each delta from observers of the network,
and clients never read it), and vLLM's ``continuous_usage_stats`` (only false: not honoured).
Any other field is refused."""


def _stream_options(options: Any, stream: bool) -> bool:
    """``stream_options`` checked; returns ``include_usage``."""
    if options is None:
        return False
    if not stream:
        raise bad_request("'stream_options' is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - set(STREAM_OPTIONS):
        raise bad_request(
            "'stream_options' must be an object with 'include_usage' and 'include_obfuscation' "
            f"(true or false); got {_show(options)}",
            "stream_options",
        )
    for key in ("include_usage", "include_obfuscation"):
        if options.get(key) is not None and not isinstance(options[key], bool):
            raise bad_request(
                f"'stream_options.{key}' must be true or false; got {_show(options[key])}",
                f"stream_options.{key}",
            )
    if options.get("continuous_usage_stats") not in (None, False):  # vLLM's: not honoured
        raise bad_request(
            "'stream_options.continuous_usage_stats' is not supported by this server (it "
            "would be ignored); omit it or send false",
            "stream_options.continuous_usage_stats",
        )
    return bool(options.get("include_usage"))


@dataclass(frozen=True)
class Common:
    """What every generation request carries, checked."""

    stream: bool
    """Answer with server-sent events."""
    include_usage: bool
    """``stream_options.include_usage``: a last chunk with ``usage`` before ``[DONE]``."""
    seed: int | None
    """Seeds this generation's own sampler (other requests' sampling is untouched)."""
    return_token_ids: bool
    """vLLM's extra: ``prompt_token_ids`` on the answer and ``token_ids`` on the choice."""


def check_common(body: dict[str, Any], model_name: str) -> Common:
    """The checks every generation endpoint shares: this server's model, ``n`` = 1, the
    streaming options, the seed, no field of :data:`UNHONOURED_FIELDS` that would be ignored.

    Raises:
        APIError: 400 naming the field, or 404 (``model_not_found``) for another model.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"'model' is required (a string); got {_show(model)}", "model")
    if model != model_name:
        raise APIError(
            HTTPStatus.NOT_FOUND,
            f"The model {model[:200]!r} does not exist; this server serves {model_name!r}.",
            "model",
            code="model_not_found",
        )
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(
            f"'n' must be 1 on this server (one choice per request); got {_show(n)}", "n"
        )
    stream = flag_field(body, "stream")
    include_usage = _stream_options(body.get("stream_options"), stream)
    return_token_ids = flag_field(body, "return_token_ids")
    if return_token_ids and stream:
        raise bad_request(
            "'return_token_ids' is only supported with stream=false", "return_token_ids"
        )
    seed = int_field(body, "seed", MIN_SEED, MAX_SEED)
    refuse_unhonoured(body, UNHONOURED_FIELDS)
    return Common(stream, include_usage, seed, return_token_ids)


@dataclass(frozen=True)
class CompletionRequest:
    """A checked ``/v1/completions`` request."""

    prompt: str | list[int]
    """The text to tokenize, or the token ids themselves."""
    max_tokens: int | None
    """Tokens to generate (0 only with ``echo``; None: the server's default)."""
    echo: bool
    """Put the prompt in front of the answer (its text, and its tokens in ``logprobs``)."""
    logprobs: int | None
    """Return the legacy ``logprobs`` object with this many alternatives per token (0..5)."""
    prompt_logprobs: int | None
    """Return vLLM's ``prompt_logprobs`` with this many alternatives per token (0..5)."""
    temperature: float
    """Sampling temperature (0: greedy)."""
    top_p: float
    """Nucleus mass, in (0, 1]."""
    seed: int | None
    """Seeds this generation's own sampler (other requests' sampling is untouched)."""
    add_special_tokens: bool
    """Tokenize a text prompt with the tokenizer's special tokens (BOS, ...); default False."""
    stream: bool = False
    """Answer with server-sent events (text only: no ``logprobs`` or ``prompt_logprobs``)."""
    include_usage: bool = False
    """``stream_options.include_usage``."""
    return_token_ids: bool = False
    """Add ``prompt_token_ids`` and ``token_ids`` to the answer."""


def parse_completion_request(body: dict[str, Any], model_name: str) -> CompletionRequest:
    """Check a ``/v1/completions`` body (legacy completions, with vLLM's ``prompt_logprobs``).

    ``prompt`` is a string or a non-empty list of token ids (batches are refused); ``stop`` is
    refused (it would cut the logprobs out of line with the text); a streamed request may not ask
    for logprobs.

    Raises:
        APIError: 400 naming the first field at fault, or 404 for another model.
    """
    common = check_common(body, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if any(t < 0 for t in prompt):
            raise bad_request("'prompt' token ids must be integers >= 0", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be a non-empty string or a non-empty list of token ids (one prompt; "
            f"batches are not supported); got {type(prompt).__name__}",
            "prompt",
        )
    echo = flag_field(body, "echo")
    max_tokens = int_field(
        body, "max_tokens", 0 if echo else 1, what="" if echo else " (0 only with echo=true)"
    )
    if body.get("stop") not in (None, [], ""):
        raise bad_request("'stop' is not supported on /v1/completions by this server", "stop")
    logprobs = int_field(body, "logprobs", 0, MAX_LOGPROBS, " or null")
    prompt_logprobs = int_field(body, "prompt_logprobs", 0, MAX_LOGPROBS, " or null")
    if common.stream and (logprobs is not None or prompt_logprobs is not None):
        raise bad_request(
            "a streamed /v1/completions request cannot ask for logprobs or prompt_logprobs; "
            "send stream=false",
            "stream",
        )
    return CompletionRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        echo=echo,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        temperature=number_field(body, "temperature", 1.0, 0.0, 100.0),
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        seed=common.seed,
        add_special_tokens=flag_field(body, "add_special_tokens"),
        stream=common.stream,
        include_usage=common.include_usage,
        return_token_ids=common.return_token_ids,
    )
