"""``POST /v1/completions`` of :mod:`llm_gym.serving`: text and logprobs out.

Legacy OpenAI completions plus vLLM's ``prompt_logprobs``, enough for a distillation teacher
(:class:`trainers.distillation.teacher.EndpointTeacher`) to score token sequences:

* ``prompt`` is a string (tokenized without special tokens unless ``add_special_tokens`` is true;
  the tiny model's tokenizer adds none either way) or a list of token ids, used as sent.
* ``max_tokens`` tokens are generated (0 with ``echo``: score only), greedy at temperature 0.
* ``prompt_logprobs: k`` adds ``choices[0].prompt_logprobs``: ``null`` for the first token, then
  per token ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for the prompt's own token and the
  ``k`` most likely ones.
* ``logprobs: k`` adds the legacy ``choices[0].logprobs``: ``tokens``, ``token_logprobs`` (the
  prompt's first ``null`` when echoed) and ``top_logprobs`` (``null`` when ``k`` is 0, else per
  token ``{decoded token: logprob}`` of the ``k`` most likely and the token itself), over the
  echoed prompt (with ``echo``) and the generated tokens.

* ``return_token_ids`` adds ``prompt_token_ids`` and ``choices[0].token_ids`` (vLLM's names).
* ``stream`` (text only) is served by :mod:`llm_gym.serving.streaming`, with the same prompt
  checks (:func:`completion_prompt`).

Logprobs are the model's own distribution (temperature 1) in float32, whatever ``temperature``
sampled with, as vLLM reports them by default.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.policies.chat import prefix_past_limit
from llm_gym.serving.generation import TokenText
from llm_gym.serving.protocol import CompletionRequest, bad_request

__all__ = ["TokenScores", "completion_prompt", "score_tokens", "text_completion"]

Generate = Callable[[list[int], int, float, float, int | None], list[int]]
"""``generate(prompt_ids, budget, temperature, top_p, seed) -> new token ids``."""


@dataclass(frozen=True)
class TokenScores:
    """Logprobs of every token of a sequence given the tokens before it (position 0 has none)."""

    logprobs: list[float | None]
    """``logprobs[k]``: of token ``k`` (``None`` at 0)."""
    ranks: list[int | None]
    """1 + how many tokens were more likely than token ``k`` (``None`` at 0)."""
    top: list[list[tuple[int, float]]]
    """The ``top_k`` most likely ``(token id, logprob)`` at ``k``, best first (empty at 0)."""


def score_tokens(model: Any, ids: Sequence[int], top_k: int = 0) -> TokenScores:
    """One forward pass over ``ids``: each token's logprob, rank and the ``top_k`` alternatives."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(ids)], device=device)).logits[0, :-1]
        logps = torch.log_softmax(logits.float(), dim=-1)
        chosen = logps.gather(-1, torch.tensor(list(ids[1:]), device=device)[:, None])
        ranks = (logps > chosen).sum(-1) + 1
        top = torch.topk(logps, top_k, dim=-1)
    alternatives = [
        list(zip(i, v, strict=True))
        for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]
    return TokenScores([None, *chosen[:, 0].tolist()], [None, *ranks.tolist()], [[], *alternatives])


def encode_within(
    tokenizer: Any, text: str, context: int | None, field: str, add_special_tokens: bool = False
) -> list[int]:
    """``text``'s token ids, where a text far too long for ``context`` tokens is refused after
    tokenizing only a prefix of it (:func:`~llm_gym.policies.chat.prefix_past_limit`: 3 MB of
    text took 9 s in the server's one model thread, queueing every other request, before the
    context check refused it).

    Raises:
        APIError: 400 naming ``field``, for a text the prefix shows too long.
    """
    if context is not None:
        past = prefix_past_limit(tokenizer, text, context, add_special_tokens)
        if past is not None:
            raise bad_request(
                f"the prompt is longer than the model's context of {context} tokens (its "
                f"first {past[0]:,} of {len(text):,} characters are {past[1]:,} tokens)",
                field,
            )
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _prompt_ids(
    request: CompletionRequest, tokenizer: Any, vocab_size: int, context: int | None
) -> list[int]:
    if isinstance(request.prompt, str):
        ids = encode_within(
            tokenizer, request.prompt, context, "prompt", request.add_special_tokens
        )
        if not ids:
            raise bad_request("'prompt' tokenizes to no tokens", "prompt")
        return ids
    bad = [t for t in request.prompt if t >= vocab_size]
    if bad:
        raise bad_request(
            f"'prompt' has token id {bad[0]}; the model's vocabulary is {vocab_size} tokens "
            f"(ids 0..{vocab_size - 1})",
            "prompt",
        )
    return list(request.prompt)


def completion_prompt(
    request: CompletionRequest,
    *,
    model: Any,
    tokenizer: Any,
    context: int | None,
    default_max_tokens: int,
    max_tokens_limit: int | None = None,
) -> tuple[list[int], int]:
    """The prompt's token ids and how many tokens to generate (0 with ``echo`` and
    ``max_tokens`` 0): the request's ``max_tokens`` or ``default_max_tokens``, within the
    context (within ``max_tokens_limit`` when the context is unknown).

    Raises:
        APIError: 400 for a prompt out of the vocabulary or longer than the context.
    """
    embeddings = model.get_output_embeddings()
    weight = getattr(embeddings, "weight", None)
    vocab_size = int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)
    ids = _prompt_ids(request, tokenizer, vocab_size, context)
    budget = default_max_tokens if request.max_tokens is None else request.max_tokens
    if context is not None:
        if len(ids) > context or (budget > 0 and len(ids) == context):
            room = "" if budget == 0 else " and leave room for one generated token"
            raise bad_request(
                f"the prompt is {len(ids)} tokens; it must fit the model's context of "
                f"{context} tokens{room}",
                "prompt",
            )
        budget = min(budget, context - len(ids))
    elif max_tokens_limit is not None:
        budget = min(budget, max_tokens_limit)
    return ids, budget


def text_completion(
    request: CompletionRequest,
    *,
    model: Any,
    tokenizer: Any,
    model_name: str,
    context: int | None,
    default_max_tokens: int,
    eos_ids: Sequence[int],
    generate: Generate,
    lock: threading.Lock,
    token_text: TokenText | None = None,
    max_tokens_limit: int | None = None,
) -> dict[str, Any]:
    """Answer a checked ``/v1/completions`` request (a ``text_completion`` object).

    Args:
        request: The checked request.
        model, tokenizer: What is served.
        model_name: The id written in the answer.
        context: The model's context in tokens (None: unbounded).
        default_max_tokens: Tokens to generate when the request sets no ``max_tokens``.
        eos_ids: Tokens that end a generation (``finish_reason`` ``"stop"``).
        generate: Samples the continuation (holding ``lock`` itself).
        lock: Held while scoring, so one forward pass runs at a time, as generation does.
        token_text: Decodes one token (a cache shared across requests; a fresh one if None).
        max_tokens_limit: The most tokens to generate when ``context`` is None.

    Raises:
        APIError: 400 for a prompt out of the vocabulary or longer than the context.
    """
    ids, budget = completion_prompt(
        request,
        model=model,
        tokenizer=tokenizer,
        context=context,
        default_max_tokens=default_max_tokens,
        max_tokens_limit=max_tokens_limit,
    )
    new = generate(ids, budget, request.temperature, request.top_p, request.seed) if budget else []
    finish = "stop" if new and new[-1] in eos_ids else "length"

    choice: dict[str, Any] = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish}
    if request.logprobs is not None or request.prompt_logprobs is not None:
        with lock:
            scores = score_tokens(
                model, ids + new, max(request.logprobs or 0, request.prompt_logprobs or 0)
            )
        decode = token_text or TokenText(tokenizer)
        if request.logprobs is not None:
            shown = range(0 if request.echo else len(ids), len(ids) + len(new))
            choice["logprobs"] = _legacy_logprobs(
                ids + new, shown, scores, request.logprobs, decode
            )
        if request.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _vllm_prompt_logprobs(
                ids, scores, request.prompt_logprobs, decode
            )
    text = tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if request.echo:
        prompt = request.prompt
        if not isinstance(prompt, str):
            prompt = tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        text = prompt + text
    choice["text"] = text
    body: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": len(new),
            "total_tokens": len(ids) + len(new),
        },
    }
    if request.return_token_ids:
        body["prompt_token_ids"], choice["token_ids"] = ids, new
    return body


def _legacy_logprobs(
    ids: list[int], shown: range, scores: TokenScores, k: int, decode: TokenText
) -> dict[str, Any]:
    """The legacy ``logprobs`` object over the positions ``shown``."""
    top: list[dict[str, float] | None] | None = None
    if k:
        top = [
            None
            if p == 0
            else {
                **{decode(t): v for t, v in scores.top[p][:k]},
                decode(ids[p]): scores.logprobs[p],
            }
            for p in shown
        ]
    return {
        "tokens": [decode(ids[p]) for p in shown],
        "token_logprobs": [scores.logprobs[p] for p in shown],
        "top_logprobs": top,
    }


def _vllm_prompt_logprobs(
    ids: list[int], scores: TokenScores, k: int, decode: TokenText
) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: the prompt's own token first, then the ``k`` most likely."""
    out: list[dict[str, Any] | None] = [None]
    for p in range(1, len(ids)):
        entry = {
            str(ids[p]): {
                "logprob": scores.logprobs[p],
                "rank": scores.ranks[p],
                "decoded_token": decode(ids[p]),
            }
        }
        for rank, (t, v) in enumerate(scores.top[p][:k], start=1):
            entry.setdefault(str(t), {"logprob": v, "rank": rank, "decoded_token": decode(t)})
        out.append(entry)
    return out
