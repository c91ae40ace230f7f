"""Constrained decoding: a per-row token mask that a grammar computes at every step.

A :class:`LogitsConstraint` says which tokens may come next (:meth:`~LogitsConstraint.allowed`)
and follows the tokens sampled (:meth:`~LogitsConstraint.advance`); the decode engine
(:mod:`llm_gym.policies.hf_engine`), the wave sampler of :class:`~llm_gym.policies.hf.HFPolicy`
and the server (:mod:`llm_gym.serving.generation`) set every other token's logit to ``-inf``
before they sample a row that has one (:class:`ConstraintProcessor` for ``model.generate``).
The logprobs a policy records are those of the masked distribution it sampled from.

:class:`GrammarCompiler` turns a grammar of :mod:`llm_gym.actions.grammar` into a
:class:`GrammarConstraint` for one tokenizer; :func:`reply_constraint` builds the grammar of a
``tool_choice`` / ``response_format`` and compiles it.

Library: **llguidance** (``pip install llm-gym[grammar]``; the ``serve`` extra has it too).
Both libraries vLLM uses cost, per tokenizer, per schema and per mask, far below one decode step of
the smallest real model, so a grammar does not slow decoding
(``benchmarks/constrained_decoding.py``; the numbers in
``benchmarks/results/constrained_decoding.md``). llguidance is chosen because (1) it has no heavy
dependency (xgrammar pulls ``triton`` on Linux, a wheel of hundreds of megabytes, and its own torch
requirement), (2) its lark grammars embed a JSON schema anywhere (``%json``), intersect and negate
terminals and name special tokens, so each action format's call syntax, the tool's schema and "text
without a call" are one grammar, and (3) its work is bounded per step (lexer fuel, Earley items), so
a hostile grammar costs an error, not the model's thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from llm_gym.actions import ActionFormat
from llm_gym.actions.grammar import (
    ANY_OBJECT,
    GrammarUnsupportedError,
    Lark,
    ToolChoice,
    ToolGrammar,
    check_schema,
    reply_grammar,
)
from llm_gym.errors import InvalidArgumentError, LlmGymError

__all__ = [
    "ConstraintProcessor",
    "GrammarCompiler",
    "GrammarConstraint",
    "LogitsConstraint",
    "MissingGrammarLibraryError",
    "compiler_for",
    "mask_row",
    "reply_constraint",
    "tool_grammars",
]


class MissingGrammarLibraryError(LlmGymError, ImportError):
    """Constrained decoding needs llguidance: ``pip install 'llm-gym[grammar]'``."""


@runtime_checkable
class LogitsConstraint(Protocol):
    """Which tokens one row may sample next."""

    def allowed(self) -> torch.Tensor:
        """A boolean tensor over the vocabulary (at least as wide as the logits' used part):
        True where the next token may be."""

    def advance(self, token_id: int) -> None:
        """The row sampled ``token_id``."""


def _limits() -> Any:
    from llguidance import LLParserLimits

    # Below llguidance's defaults, so one request's grammar cannot hold up a decode step.
    return LLParserLimits(
        initial_lexer_fuel=500_000,
        step_lexer_fuel=200_000,
        step_max_items=20_000,
        max_grammar_size=200_000,
        verbose_errors=False,
    )


class GrammarConstraint:
    """A :class:`LogitsConstraint` that follows a compiled grammar (an llguidance matcher).

    Once the grammar is complete only an end-of-sequence id is allowed. A token the grammar
    refuses (a caller that sampled without the mask) ends the constraint: every token is
    allowed after it, so decoding goes on as it would unconstrained.
    """

    def __init__(self, matcher: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)
        self.broken = False
        """True once a token the grammar refused was fed."""
        self.fed = 0
        """Tokens the grammar took (end-of-sequence ids are not fed)."""
        self.accepted = 0
        """:attr:`fed` when the grammar was last complete (0: never after a token)."""
        self._words = (vocab_size + 31) // 32
        self._bits = torch.empty((1, self._words), dtype=torch.int32)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        if self.broken:
            return torch.ones(self.vocab_size, dtype=torch.bool)
        from llguidance.torch import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self._bits, 0)
        mask = ((self._bits[0, :, None] >> self._shifts) & 1).bool().reshape(-1)
        mask = mask[: self.vocab_size]
        if self.matcher.is_accepting() or self.matcher.is_stopped():
            for eos in self.eos_ids:
                if eos < self.vocab_size:
                    mask[eos] = True
        return mask

    def advance(self, token_id: int) -> None:
        if self.broken or token_id in self.eos_ids or self.matcher.is_stopped():
            return
        if not self.matcher.consume_token(int(token_id)):
            self.broken = True
            return
        self.fed += 1
        if self.matcher.is_accepting():
            self.accepted = self.fed

    def complete_prefix(self, token_ids: Sequence[int]) -> int | None:
        """How many of ``token_ids`` (the row's tokens so far, in order) make the longest
        whole sentence of the grammar, or None when none does or all of them do. The tokens
        the grammar has not taken yet are fed first (a decode loop feeds each token on the
        step after it was sampled, so the last one may be pending)."""
        for token_id in token_ids[self.fed :]:
            if self.broken or self.matcher.is_stopped() or token_id in self.eos_ids:
                break
            self.advance(token_id)
        if self.broken or self.accepted == 0 or self.accepted >= len(token_ids):
            return None
        return self.accepted

    @property
    def complete(self) -> bool:
        """Whether what was fed is a whole sentence of the grammar."""
        return not self.broken and bool(self.matcher.is_accepting())


class GrammarCompiler:
    """Compiles grammars for one tokenizer and vocabulary width.

    Args:
        tokenizer: A Hugging Face tokenizer.
        vocab_size: The logits' width (the model's vocabulary; at least the tokenizer's).
        eos_ids: The ids that end a reply: allowed once the grammar is complete.

    Raises:
        MissingGrammarLibraryError: llguidance is not installed.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        try:
            import llguidance.hf
        except ImportError as exc:
            raise MissingGrammarLibraryError(
                "Constrained decoding (tool_choice 'required' or a named tool, strict tools, "
                "response_format json_object / json_schema) needs llguidance; install it with "
                "pip install 'llm-gym[grammar]' (the serve extra includes it)."
            ) from exc
        self.vocab_size = max(int(vocab_size), len(tokenizer))
        self.eos_ids = sorted({int(i) for i in eos_ids})
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_ids or None
        )
        tokens = {}
        for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
            if str(added.content):
                tokens[str(added.content)] = (int(token_id), bool(added.special))
        self.lark = Lark(tokens)
        """Writes grammars with this tokenizer's special tokens."""

    def check(self, grammar: str) -> str | None:
        """Why ``grammar`` cannot be used (a compile error, or it admits no reply), else None."""
        constraint = self._matcher(grammar)
        if isinstance(constraint, str):
            return constraint
        try:
            mask = constraint.allowed()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if constraint.matcher.is_error():
            return str(constraint.matcher.get_error())[:500] or "the grammar admits no reply"
        if not bool(mask.any()):
            return "the grammar admits no reply"
        return None

    def _matcher(self, grammar: str) -> GrammarConstraint | str:
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            return str(matcher.get_error())[:500]
        return GrammarConstraint(matcher, self.vocab_size, self.eos_ids)

    def constraint(self, grammar: str) -> GrammarConstraint:
        """A fresh constraint that follows ``grammar``.

        Raises:
            InvalidArgumentError: The grammar does not compile.
        """
        constraint = self._matcher(grammar)
        if isinstance(constraint, str):
            raise InvalidArgumentError(f"The grammar does not compile: {constraint}")
        return constraint


_COMPILERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], GrammarCompiler]]
_COMPILERS = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()


def compiler_for(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> GrammarCompiler:
    """The :class:`GrammarCompiler` of ``tokenizer`` (built once per tokenizer, width and
    end-of-sequence ids: building reads the whole vocabulary, ~0.5 s for 49k tokens)."""
    key = (int(vocab_size), tuple(sorted({int(i) for i in eos_ids})))
    with _COMPILERS_LOCK:
        try:
            table = _COMPILERS.setdefault(tokenizer, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced: not cached
            return GrammarCompiler(tokenizer, vocab_size, eos_ids)
        compiler = table.get(key)
        if compiler is None:
            compiler = table[key] = GrammarCompiler(tokenizer, vocab_size, eos_ids)
        return compiler


def tool_grammars(
    tool_specs: Sequence[Mapping[str, Any]], choice: ToolChoice, where: str = "tools"
) -> list[ToolGrammar]:
    """The tools of OpenAI-style ``tool_specs`` as a grammar offers them: under a forced choice
    every tool's arguments follow its ``parameters``; under ``auto`` only ``strict`` tools' do
    (the others take any JSON object).

    Raises:
        InvalidArgumentError: A schema :func:`~llm_gym.actions.grammar.check_schema` refuses
            (the message names ``{where}[i].function.parameters``).
    """
    out = []
    for i, spec in enumerate(tool_specs):
        function = spec.get("function", spec)
        schema = function.get("parameters")
        if schema is None or not (choice.forced or function.get("strict") is True):
            schema = ANY_OBJECT
        check_schema(schema, f"{where}[{i}].function.parameters")
        out.append(ToolGrammar(str(function["name"]), schema))
    return out


def reply_constraint(
    compiler: GrammarCompiler,
    action_format: ActionFormat,
    tool_specs: Sequence[Mapping[str, Any]],
    choice: ToolChoice,
    *,
    parallel: bool = True,
    answer: Mapping[str, Any] | None = None,
) -> str | None:
    """The grammar a reply must follow (checked: it compiles and admits a reply), or None when
    nothing constrains it (no forced call, no strict tool under ``auto``, no answer schema),
    or when strict tools under ``auto`` meet a format that cannot say what text holds no call
    (``harmony``: such calls are parsed, their arguments not enforced).

    Raises:
        InvalidArgumentError: A schema or grammar that cannot be used; the message says which
            (``GrammarUnsupportedError`` when the action format cannot write it).
    """
    strict = any(s.get("function", s).get("strict") is True for s in tool_specs)
    offer_calls = bool(tool_specs) and choice.mode != "none"
    if not (choice.forced or (offer_calls and strict) or answer is not None):
        return None
    if answer is not None:
        check_schema(answer, "response_format.json_schema.schema")
    tools = tool_grammars(tool_specs, choice) if offer_calls else []
    try:
        grammar = reply_grammar(
            action_format,
            tools,
            choice=choice,
            parallel=parallel,
            answer=answer,
            lark=compiler.lark,
        )
    except GrammarUnsupportedError:
        if choice.forced or answer is not None:
            raise
        return None  # strict tools under auto, in a format that cannot say what text is
    error = compiler.check(grammar)
    if error is not None:
        raise InvalidArgumentError(f"The reply's grammar cannot be used: {error}")
    return grammar


def mask_row(logits: torch.Tensor, constraint: LogitsConstraint) -> torch.Tensor:
    """Set ``logits`` (one row over the vocabulary) to ``-inf`` wherever ``constraint`` allows
    no token (in place); returns the mask applied (True: allowed)."""
    allowed = constraint.allowed().to(logits.device)
    width = min(allowed.shape[0], logits.shape[-1])
    logits[:width].masked_fill_(~allowed[:width], float("-inf"))
    logits[width:] = float("-inf")
    return allowed[:width]


class ConstraintProcessor:
    """A logits processor for ``model.generate``: row ``i`` of the batch follows
    ``constraints[i]`` (None: unconstrained). Each call first advances every constraint by the
    token its row sampled last (rows past their end of sequence are left alone)."""

    def __init__(self, constraints: Sequence[LogitsConstraint | None]) -> None:
        self.constraints = list(constraints)
        self.started = False
        self.done = [False] * len(self.constraints)
        self.masks: list[torch.Tensor] = []
        """Each step's allowed tokens (batch, vocabulary)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.started:
            for row, constraint in enumerate(self.constraints):
                if constraint is not None and not self.done[row]:
                    token = int(input_ids[row, -1])
                    eos = getattr(constraint, "eos_ids", ())
                    self.done[row] = token in eos
                    constraint.advance(token)
        self.started = True
        step = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        for row, constraint in enumerate(self.constraints):
            if constraint is not None and not self.done[row]:
                allowed = mask_row(scores[row], constraint)
                step[row, : allowed.shape[0]] = allowed
                step[row, allowed.shape[0] :] = False
        self.masks.append(step)
        return scores
