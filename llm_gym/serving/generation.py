"""One generation, token by token: sampling with logprobs, then text pieces cut at stop strings.

:func:`sample_tokens` runs ``model.generate`` for one prompt and hands every new token, as it
is sampled, to a callback (a :class:`TokenOut`: its id and, when asked, its logprob and the most
likely alternatives); the callback can stop the generation. Logprobs are read from the scores
after the model's own logits processors and before temperature and top-p (the distribution
vLLM reports by default), so they do not depend on the sampling settings. Each sampled
generation draws from a generator of its own (seeded with the request's ``seed``, or from the
operating system's entropy): no request reads or moves torch's global generator, so one
client's seed never fixes another client's sampling.

:class:`TextAssembler` turns those tokens into text pieces: incremental detokenization (a
token that ends inside a multi-byte character waits for the next one), the end-of-sequence token
ends the text, stop strings are held back until they can no longer match and cut the text where
they start. Streaming sends each piece as it comes; a whole answer joins them, so both paths
give the same text.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Piece", "Sampling", "TextAssembler", "TokenOut", "TokenText", "sample_tokens"]


@dataclass(frozen=True)
class Sampling:
    """How to sample one generation."""

    max_tokens: int
    """Tokens to generate at most (the end-of-sequence token included)."""
    temperature: float = 1.0
    """0: greedy."""
    top_p: float = 1.0
    """Nucleus mass, in (0, 1]."""
    seed: int | None = None
    """Seeds the generation's own generator (None: a generator seeded from the operating
    system's entropy)."""
    logprobs: int | None = None
    """``None``: no logprobs; ``k``: each token's logprob and its ``k`` most likely alternatives."""
    constraint: Any = None
    """A :class:`~llm_gym.policies.constraint.LogitsConstraint` the tokens follow (None: free);
    the logprobs reported are the model's, before its mask (vLLM's default)."""
    keep_complete: bool = False
    """A reply that ``max_tokens`` cuts is cut back to where ``constraint`` was last complete
    (a forced reply keeps its whole tool calls and drops the one the budget cut)."""


@dataclass(frozen=True)
class TokenOut:
    """One sampled token."""

    token_id: int
    logprob: float | None = None
    """Its logprob (``None`` when not asked for)."""
    top: tuple[tuple[int, float], ...] = ()
    """The most likely ``(token id, logprob)`` at its position, best first."""
    version: int = -1
    """The weight version that sampled it (-1: the weights are not versioned)."""


class _Capture:
    """A logits processor (records log-softmax rows) and a streamer (pairs each new token with
    its row) in one; rows are queued, so a streamer that runs a step behind still pairs right."""

    def __init__(
        self, top_k: int | None, on_token: Callable[[TokenOut], bool], stop: list[bool]
    ) -> None:
        self.top_k = top_k
        self.on_token = on_token
        self.stop = stop
        self.rows: deque[Any] = deque()
        self.prompt_seen = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:  # logits processor
        import torch

        self.rows.append(torch.log_softmax(scores[0].float(), dim=-1))
        return scores

    def put(self, value: Any) -> None:  # streamer: the prompt first, then one token per step
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token_id in value.reshape(-1).tolist():
            out = TokenOut(int(token_id))
            if self.top_k is not None and self.rows:
                row = self.rows.popleft()
                top: tuple[tuple[int, float], ...] = ()
                if self.top_k:
                    values, indices = row.topk(min(self.top_k, row.shape[0]))
                    top = tuple(zip(indices.tolist(), values.tolist(), strict=True))
                out = TokenOut(int(token_id), float(row[token_id]), top)
            if not self.stop[0] and self.on_token(out):
                self.stop[0] = True

    def end(self) -> None:
        pass


class _StopFlag:
    """A stopping criterion that reads the flag the token callback sets."""

    def __init__(self, stop: list[bool]) -> None:
        self.stop = stop

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        shape = (input_ids.shape[0],)
        return torch.full(shape, self.stop[0], dtype=torch.bool, device=input_ids.device)


def sample_tokens(
    model: Any,
    prompt_ids: Sequence[int],
    sampling: Sampling,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    on_token: Callable[[TokenOut], bool],
) -> None:
    """Generate from ``prompt_ids``, calling ``on_token`` with every new token in order.

    ``on_token`` returns True to stop (the step in flight finishes, its token is not passed on).
    The caller holds whatever lock serialises the model.
    """
    import torch

    from llm_gym.policies.hf_sampling import GeneratorSampling

    device = next(model.parameters()).device
    stop = [False]
    capture = _Capture(sampling.logprobs, on_token, stop)
    processors: list[Any] = [capture] if sampling.logprobs is not None else []
    if sampling.constraint is not None:
        from llm_gym.policies.constraint import ConstraintProcessor

        processors.append(ConstraintProcessor([sampling.constraint]))
    if sampling.temperature != 0:  # drawn by the last processor; greedy decoding takes it
        generator = torch.Generator(device=device)
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        processors.append(GeneratorSampling(sampling.temperature, sampling.top_p, generator))
    kwargs: dict[str, Any] = {
        "max_new_tokens": sampling.max_tokens,
        "do_sample": False,
        "pad_token_id": pad_id,
        "eos_token_id": list(eos_ids) or None,
        "streamer": capture,
        "stopping_criteria": [_StopFlag(stop)],
        "logits_processor": processors,
    }
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)


class TokenText:
    """One token's own text (special tokens included), each id decoded once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return text


@dataclass
class Piece:
    """Text that is final (no stop string can still start in it) and the tokens that wrote it."""

    text: str
    tokens: list[TokenOut] = field(default_factory=list)


class TextAssembler:
    """Generated tokens in, :class:`Piece` s out (see the module docstring).

    Args:
        tokenizer: Decodes the tokens.
        eos_ids: Tokens that end the text (``finish_reason`` ``"stop"``); not part of the text.
        stops: Stop strings: the text ends where the first one starts (``"stop"``).
        keep_special: Keep the special tokens' text (a reply whose tool calls are parsed: an
            action format's markers may be special tokens, Mistral's ``[TOOL_CALLS]``,
            harmony's ``<|channel|>``, as the rollout keeps them); False: skip them.
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_ids: Sequence[int],
        stops: Sequence[str] = (),
        keep_special: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.keep_special = keep_special
        self.eos_ids = frozenset(eos_ids)
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        """Every generated token but the end-of-sequence one, in order (what is decoded)."""
        self.generated: list[int] = []
        """Every token generated until the text ended, the end-of-sequence one included."""
        self.text = ""
        self.finish: str | None = None
        """``"stop"`` once an end-of-sequence token or a stop string ended the text."""
        self.dropped = 0
        """Tokens :meth:`rewind` took back (sampled, not in the reply)."""
        self._sent = 0
        self._pending: list[tuple[TokenOut, int]] = []  # tokens not yet sent, with their start
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=not self.keep_special, clean_up_tokenization_spaces=False
        )

    def _step(self, final: bool) -> str:
        """The new text of the tokens since the last call (TGI's prefix/read offsets)."""
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def feed(self, token: TokenOut) -> Piece | None:
        """Take the next token; the text now final, if any (also once :attr:`finish` is set)."""
        if self.finish is not None:
            return None
        self.generated.append(token.token_id)
        if token.token_id in self.eos_ids:
            self.finish = "stop"
            return self.flush()
        self.ids.append(token.token_id)
        self._pending.append((token, len(self.text)))
        before = len(self.text)
        self.text += self._step(final=False)
        if self.stops:
            start = max(0, before - self.hold)
            cuts = [i for i in (self.text.find(s, start) for s in self.stops) if i != -1]
            if cuts:
                cut = min(cuts)
                self.text = self.text[:cut]
                self._pending = [(t, s) for t, s in self._pending if s < cut]
                self.finish = "stop"
                return self.flush()
        ready = len(self.text) - self.hold
        if ready > self._sent:
            return self._take(ready)
        return None

    def _take(self, end: int) -> Piece:
        piece = Piece(self.text[self._sent : end], [t for t, _ in self._pending])
        self._pending = []
        self._sent = end
        return piece

    def rewind(self, kept: int) -> None:
        """Keep the first ``kept`` tokens and end the text there (``finish`` ``"stop"``).

        :attr:`text` becomes their text; tokens not handed out yet past them are dropped. Text
        already handed out past them is the caller's to drop: the reply is ``text``.
        """
        if self.finish is not None or not 0 <= kept < len(self.ids):
            raise ValueError(f"rewind({kept}) needs an unfinished text of more than {kept} tokens")
        first_pending = len(self.ids) - len(self._pending)
        self._pending = self._pending[: max(0, kept - first_pending)]
        self.dropped = len(self.ids) - kept
        self.ids = self.ids[:kept]
        self.generated = self.generated[:kept]
        self.text = self._decode(self.ids)
        self._sent = min(self._sent, len(self.text))
        self.finish = "stop"

    def flush(self) -> Piece:
        """Everything not sent yet (call it once the generation is over)."""
        if self.finish is None:
            self.text += self._step(final=True)
        return self._take(len(self.text))
