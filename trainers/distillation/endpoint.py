"""On-policy distillation's endpoint teacher: prompt logprobs from an OpenAI-compatible server.

:class:`EndpointTeacher` sends each sequence to ``{base_url}/completions`` (vLLM, or
``llm-gym serve``) and reads the prompt's logprobs back with :func:`parse_prompt_logprobs`, which
accepts vLLM's ``prompt_logprobs`` and the legacy echo form. :func:`check_sequences` is the
argument check every teacher shares. :mod:`trainers.distillation.teacher` re-exports all of it.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence
from typing import Any

from llm_gym.aio import run_sync
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.http import DEFAULT_MAX_RESPONSE_BYTES, JsonClient, MalformedResponseError

__all__ = [
    "EndpointTeacher",
    "LOGPROB_FLOOR",
    "LOGPROB_TOLERANCE",
    "Sequences",
    "check_sequences",
    "parse_prompt_logprobs",
]

LOGPROB_TOLERANCE = 1e-4
"""How far above 0 an endpoint's logprob may be (rounding) before the answer counts as malformed."""
LOGPROB_FLOOR = -1e6
"""The lowest logprob an endpoint's answer may hold: far below a real model's (a log-softmax
over logits of any sane scale), and far inside float32's range, where the trainer holds the
teacher's logprobs (a finite ``-1e300`` is ``-inf`` there, and the advantages and the loss with
it)."""

Sequences = Sequence[tuple[Sequence[int], int]]
"""``(token_ids, start)`` pairs: score ``token_ids[start:]``, each given the tokens before it."""


def check_sequences(sequences: Sequences, vocab_size: int | None = None) -> None:
    """Refuse a ``start`` outside ``[1, len(token_ids)]``, a token id that is not an integer
    (a bool, a float, text), or one outside ``[0, vocab_size)`` (any non-negative id when
    ``vocab_size`` is None)."""
    for i, (ids, start) in enumerate(sequences):
        odd = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if odd:
            raise InvalidArgumentError(
                f"sequences[{i}] has token id {odd[0]!r:.40} ({type(odd[0]).__name__}); token "
                "ids are ints (the student's tokenizer's ids)."
            )
        if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= len(ids):
            raise InvalidArgumentError(
                f"sequences[{i}]: start must be an int in [1, len(token_ids)={len(ids)}], "
                f"actual value: {start!r}."
            )
        bad = [t for t in ids if not 0 <= t < (math.inf if vocab_size is None else vocab_size)]
        if bad:
            raise InvalidArgumentError(
                f"sequences[{i}] has token id {bad[0]}, outside the teacher's vocabulary "
                f"(vocab_size={vocab_size}). The teacher must share the student's tokenizer."
            )


class EndpointTeacher:
    """A teacher behind an OpenAI-compatible ``/completions`` endpoint with prompt logprobs.

    Each sequence is one request (``max_tokens=1, echo=true, logprobs=0, prompt_logprobs=0``);
    up to ``max_concurrency`` are in flight at once. A connection error, HTTP 429 or 5xx is
    retried once; answers are checked (:func:`parse_prompt_logprobs`).

    Args:
        base_url: The API root, e.g. ``http://host:8000/v1``.
        model: The served model's id.
        api_key: Sent as ``Authorization: Bearer ...`` when given.
        timeout_s: Deadline of one request (a timed-out request is sent once more).
        max_concurrency: Requests in flight at once.
        max_response_bytes: Largest answer read (a larger one fails the call).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120,
        max_concurrency: int = 4,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError(
                f"model must be a non-empty string, actual value: {model!r}."
            )
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise InvalidArgumentError(
                f"max_concurrency must be an int >= 1, actual value: {max_concurrency!r}."
            )
        if not timeout_s > 0:
            raise InvalidArgumentError(f"timeout_s must be > 0, actual value: {timeout_s!r}.")
        if not isinstance(base_url, str):
            raise InvalidArgumentError(
                "base_url must be an http(s):// URL string (e.g. 'http://127.0.0.1:8000/v1'), "
                f"actual value: {base_url!r:.100}."
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.url = f"{self.base_url}/completions"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = JsonClient(
            self.url,
            headers=lambda: headers,
            label=f"for teacher model {model!r}",
            max_concurrency=max_concurrency,
            max_retries=1,
            request_timeout_s=float(timeout_s),
            backoff_base_s=0.25,
            max_response_bytes=max_response_bytes,
        )

    def __repr__(self) -> str:
        return f"EndpointTeacher({self.url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def logprobs(self, sequences: list[tuple[list[int], int]]) -> list[list[float]]:
        check_sequences(sequences)
        return run_sync(self._all(sequences))

    async def _all(self, sequences: Sequences) -> list[list[float]]:
        return list(await asyncio.gather(*(self._one(ids, start) for ids, start in sequences)))

    async def _one(self, ids: Sequence[int], start: int) -> list[float]:
        payload = {
            "model": self.model,
            "prompt": [int(t) for t in ids],
            "max_tokens": 1,
            "temperature": 0,
            "echo": True,
            "logprobs": 0,
            "prompt_logprobs": 0,
        }
        reply = await self._client.post(payload)
        try:
            values = parse_prompt_logprobs(reply.body, ids)
        except ValueError as exc:
            raise MalformedResponseError(
                f"{self.url} answered a malformed completion: {exc}", status=200
            ) from exc
        return values[start:]


def _finite_logprob(value: Any, where: str) -> float:
    """``value`` as a float when it is a logprob: a number in ``[LOGPROB_FLOOR,
    LOGPROB_TOLERANCE]``; else ValueError naming ``where`` (an int past float's range too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {value!r:.60}, not a number")
    if not LOGPROB_FLOOR <= value <= LOGPROB_TOLERANCE:  # NaN fails both; a huge int compares
        raise ValueError(
            f"{where} is {value!r:.60}, not a finite logprob <= 0 (>= {LOGPROB_FLOOR:g})"
        )
    return float(value)


def parse_prompt_logprobs(body: Any, token_ids: Sequence[int]) -> list[float | None]:
    """The prompt's logprobs from a ``/completions`` answer (``[None, lp_1, ..., lp_{n-1}]``).

    Reads vLLM's ``choices[0].prompt_logprobs`` (``[null, {"<id>": {"logprob": x, ...}, ...}]``,
    the entry of the actual token is taken) or else the legacy echo form
    ``choices[0].logprobs.token_logprobs`` (its first ``len(token_ids)`` entries; one generated
    token may follow). Entry 0 is not read. Raises ``ValueError`` naming what is malformed.
    """
    n = len(token_ids)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("no choices[0] object in the answer")
    choice = choices[0]
    entries = choice.get("prompt_logprobs")
    if entries is not None:
        if not isinstance(entries, list) or len(entries) != n:
            size = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise ValueError(
                f"choices[0].prompt_logprobs has {size} entries; the prompt has {n} tokens"
            )
        out: list[float | None] = [None]
        for k in range(1, n):
            where = f"choices[0].prompt_logprobs[{k}]"
            entry = entries[k]
            if not isinstance(entry, dict) or str(token_ids[k]) not in entry:
                raise ValueError(f"{where} has no entry for the prompt's token id {token_ids[k]}")
            value = entry[str(token_ids[k])]
            value = value.get("logprob") if isinstance(value, dict) else value
            out.append(_finite_logprob(value, f"{where}[{str(token_ids[k])!r}]"))
        return out
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list):
        raise ValueError(
            "the answer has neither choices[0].prompt_logprobs nor "
            "choices[0].logprobs.token_logprobs (does the server return prompt logprobs?)"
        )
    if len(values) not in (n, n + 1):  # echo: the prompt's entries, then at most one generated
        raise ValueError(
            f"choices[0].logprobs.token_logprobs has {len(values)} entries; the prompt has {n} "
            "tokens, so n or n + 1 were expected (was echo honoured?)"
        )
    where = "choices[0].logprobs.token_logprobs"
    return [None] + [_finite_logprob(values[k], f"{where}[{k}]") for k in range(1, n)]
