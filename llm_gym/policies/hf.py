"""``HFPolicy``: a transformers causal LM as a batched, token-in/token-out policy.

Two ways to batch, one contract. By default (``batching="continuous"``) the policy opens a stream
for each collection, run by :class:`~llm_gym.policies.hf_engine.DecodeEngine`: every episode keeps
its KV cache across its turns, the shared system prompt is prefilled once, and an episode whose
turn ended rejoins the running batch as soon as its environment has stepped. With
``batching="waves"`` (and for architectures the engine does not cover) it is one ``generate`` call
per wave: every episode that awaits an action is left-padded into one batch, its whole context
prefilled again. Either way the policy continues from exactly the ids the loop's
:class:`~llm_gym.rollout.tokens.TokenTracker` holds (``PolicyRequest.prompt_ids``), and returns
the sampled ids with their logprobs, so the training sample holds the very tokens that were
generated.

Logprobs are ``log_softmax(logits / temperature)`` of the sampled token under the model, before
top-p truncation: the same quantity TRL's GRPO loss computes for the current policy, so the two
line up in the importance ratio.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.base import Generation, Policy, PolicyRequest, PolicyStream
from llm_gym.policies.chat import render_chat
from llm_gym.policies.chat_templates import apply_chat_template, require_chat_template
from llm_gym.policies.template_tools import check_template_tools
from llm_gym.policies.weights import VersionedWeights

__all__ = ["HFPolicy"]

DEFAULT_MAX_NEW_TOKENS = 256
BATCHING_MODES = ("continuous", "waves")


class HFPolicy(Policy):
    """A transformers model and tokenizer (CPU or GPU) behind the batched policy interface.

    Args:
        model: A causal LM (``AutoModelForCausalLM``).
        tokenizer: Its tokenizer, with a chat template.
        temperature: Sampling temperature; 0 means greedy decoding.
        top_p: Nucleus sampling mass.
        max_new_tokens: Tokens per assistant turn when the request sets none.
        seed: Seeds the sampling of each collection (``seed`` + the collection's number:
            reproducible sampling; torch's global generator is left alone), or None (torch's
            global generator). The continuous engine draws each episode's tokens from a stream
            of its own, so neither ``kv_budget_bytes`` nor ``max_batch_size`` changes the draws
            of a seeded episode (only the batch's shape can move the logits' last bits); a wave
            draws from one generator for its whole batch.
        max_batch_size: Most episodes generated together (None: all of them): the largest
            ``generate`` batch, or the most episodes holding a row of the continuous engine.
            ``"auto"``: the engine's rows picked from tokens/s measured against rows in flight
            on this model (:func:`~llm_gym.policies.rows_curve.rows_in_flight`, seconds once
            per model in a process) within the key/value budget; waves take all episodes.
        chat_template_kwargs: Extra chat template arguments (when a request has no prompt ids).
        template_tools: A chat template that cannot render tools (when a request has no prompt
            ids): ``"fallback"`` (the tools as text, :mod:`llm_gym.policies.template_tools`)
            or ``"require"`` (refused). A rollout's prompt ids follow the rollout's own setting.
        batching: ``"continuous"`` (per-episode KV caches, a shared prompt prefix, continuous
            batching; falls back to waves for architectures the engine does not cover) or
            ``"waves"`` (one ``generate`` per wave of waiting episodes).
        weights: Versioned weights (async training): ``model`` is ``weights.model``; staged
            versions are swapped in between forward passes (see
            :mod:`llm_gym.policies.weights`), and every generation records the version that
            sampled each token (``Generation.policy_versions``).
        kv_budget_bytes: Most bytes the continuous engine's keys and values may take, at every
            step: episodes past it wait for a row, in the order they came, and the newest rows
            give theirs up (computed again later) when growing turns would pass it (None: an
            eighth of the memory on a CPU, the container's limit where one is set, a quarter of
            the free memory on an accelerator: ``kv_budget.default_kv_budget``).
        chat_template: A named template (``"chatml"``, ``"gemma"``) or a ``.jinja`` file given
            to the tokenizer (and the model: tokens it lacks are added, see
            :mod:`llm_gym.policies.chat_templates`); None keeps the tokenizer's own.

    Raises:
        ChatTemplateError: the tokenizer has no chat template and ``chat_template`` gives none
            (refused before any episode, naming the remedy).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        seed: int | None = 0,
        max_batch_size: int | str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        name_or_path: str | None = None,
        batching: str = "continuous",
        weights: VersionedWeights | None = None,
        kv_budget_bytes: int | None = None,
        template_tools: str = "fallback",
        chat_template: str | None = None,
    ) -> None:
        if temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0, actual value: {temperature}.")
        if not 0 < top_p <= 1:
            raise InvalidArgumentError(f"top_p must be in (0, 1], actual value: {top_p}.")
        if max_new_tokens < 1:
            raise InvalidArgumentError(
                f"max_new_tokens must be >= 1, actual value: {max_new_tokens}."
            )
        if batching not in BATCHING_MODES:
            raise InvalidArgumentError(
                f"batching must be one of {BATCHING_MODES}, actual value: {batching!r}."
            )
        if max_batch_size is not None and max_batch_size != "auto":
            if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
                raise InvalidArgumentError(
                    f"max_batch_size must be an int >= 1, 'auto' or None, actual value: "
                    f"{max_batch_size!r}."
                )
            if max_batch_size < 1:
                raise InvalidArgumentError(
                    f"max_batch_size must be >= 1 ('auto' or None to leave it to the engine), "
                    f"actual value: {max_batch_size}."
                )
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise InvalidArgumentError("The tokenizer needs a pad or an eos token for batching.")
        if weights is not None and weights.model is not model:
            raise InvalidArgumentError("weights.model must be the policy's model.")
        apply_chat_template(tokenizer, chat_template, model)
        require_chat_template(tokenizer, model, what=f"model {name_or_path or 'given'!r}")
        self.model = model
        self.weights = weights
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_tools = check_template_tools(template_tools)
        self.name_or_path = name_or_path or getattr(model, "name_or_path", None)
        self.batching = batching
        self.kv_budget_bytes = kv_budget_bytes
        self.chat_template = chat_template
        """The ``chat_template`` option the tokenizer was given (None: its own template)."""
        self.batching_note: str | None = None
        """Why the policy batches in waves though continuous batching was asked for (an
        architecture the engine does not cover), once a collection found it; else None."""
        self.generate_calls = 0
        """``generate`` calls (waves)."""
        self.forward_passes = 0
        """Forward passes of the continuous engine (each serves every episode with work)."""
        self.prefilled_tokens = 0
        """Tokens the continuous engine prefilled: each shared prefix once, then what each
        episode's context adds to it (the environment's deltas; never a context it holds)."""
        self.shared_prefix_tokens = 0
        """Length of the prefix the last stream's episodes shared (prefilled once)."""
        self.idle_seconds = 0.0
        """Seconds the continuous engine waited with no turn to sample (closed streams)."""
        self._batches = 0

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: str | None = None,
        dtype: str = "float32",
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> HFPolicy:
        """Load a model and tokenizer with ``from_pretrained`` (a local directory or hub id;
        :func:`llm_gym.policies.loading.load_for_generation`, which applies ``chat_template``
        and refuses a model without one)."""
        from llm_gym.policies.loading import load_for_generation

        model, tokenizer = load_for_generation(
            path, dtype=dtype, device=device, chat_template=chat_template
        )
        policy = cls(model, tokenizer, name_or_path=path, **kwargs)
        policy.chat_template = chat_template
        return policy

    @classmethod
    def from_spec(
        cls, argument: str = "", *, model: Any = None, tokenizer: Any = None, **options: Any
    ) -> HFPolicy:
        """``hf:PATH`` loads a local folder or hub id with :meth:`from_pretrained`; ``hf`` with
        ``model=`` and ``tokenizer=`` wraps objects already in memory (the trainer's model).
        Other options go to the constructor (``temperature``, ``seed``, ``max_new_tokens``...)."""
        if model is not None:
            if argument or tokenizer is None:
                raise InvalidArgumentError(
                    "hf with model= needs tokenizer= and no path after 'hf:' (got "
                    f"path {argument!r}, tokenizer {type(tokenizer).__name__})."
                )
            return cls(model, tokenizer, **options)
        if not argument:
            raise InvalidArgumentError(
                "Expected 'hf:PATH' (a model folder or hub id), or model= and tokenizer=."
            )
        return cls.from_pretrained(argument, **options)

    def describe(self) -> dict[str, Any]:
        described = {
            "name": self.name,
            "model": self.name_or_path,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "batching": self.batching,
        }
        if self.chat_template is not None:
            described["chat_template"] = str(self.chat_template)
        if self.batching_note is not None:
            described["batching_note"] = self.batching_note
        return described

    def open_stream(self) -> PolicyStream | None:
        """A continuous-batching session (None with ``batching="waves"`` or an architecture the
        engine does not cover: the loop then batches in waves)."""
        if self.batching != "continuous":
            return None
        from llm_gym.policies.hf_engine import unsupported_reason

        reason = unsupported_reason(self.model)
        if reason is not None:
            self.batching_note = (
                f"batches in waves: continuous batching does not cover this model ({reason})"
            )
            warnings.warn(f"HFPolicy {self.batching_note}.", stacklevel=2)
            self.batching = "waves"
            return None
        from llm_gym.policies.hf_stream import HFStream

        return HFStream(self)

    def engine_rows(self, kv_budget_bytes: int) -> int | None:
        """The continuous engine's most rows: ``max_batch_size``, or with ``"auto"``
        :func:`~llm_gym.policies.rows_curve.rows_in_flight` within ``kv_budget_bytes``, each
        row at the curve probe's context plus one turn of ``max_new_tokens``."""
        if self.max_batch_size != "auto":
            return self.max_batch_size  # type: ignore[return-value]
        from llm_gym.policies.rows_curve import PROBE_CONTEXT, rows_in_flight

        return rows_in_flight(self.model, kv_budget_bytes, PROBE_CONTEXT + self.max_new_tokens)

    def _prompt_ids(self, request: PolicyRequest) -> list[int]:
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        text = render_chat(
            self.tokenizer,
            request.messages,
            request.tool_specs,
            add_generation_prompt=True,
            chat_template_kwargs=self.chat_template_kwargs,
            action_format=request.action_format,
            template_tools=self.template_tools,
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def constraint_for(self, request: PolicyRequest) -> Any:
        """The :class:`~llm_gym.policies.constraint.LogitsConstraint` of ``request``'s reply
        (its ``tool_choice`` forced, or strict tools), or None when nothing constrains it.

        Raises:
            InvalidArgumentError: A ``tool_choice`` or schema that cannot be enforced.
            MissingGrammarLibraryError: A constraint is needed and llguidance is missing.
        """
        strict = any(s.get("function", s).get("strict") is True for s in request.tool_specs)
        if request.tool_choice in (None, "auto", "none") and not strict:
            return None
        from llm_gym.actions.grammar import parse_tool_choice
        from llm_gym.policies.constraint import compiler_for, reply_constraint

        names = [s.get("function", s).get("name") for s in request.tool_specs]
        choice = parse_tool_choice(request.tool_choice, names)
        width = self.model.get_output_embeddings().weight.shape[0]
        compiler = compiler_for(self.tokenizer, width, self._eos_ids())
        grammar = reply_constraint(compiler, request.action_format, request.tool_specs, choice)
        return None if grammar is None else compiler.constraint(grammar)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        if not requests:
            return []
        size = self.max_batch_size if isinstance(self.max_batch_size, int) else len(requests)
        out: list[Generation] = []
        for start in range(0, len(requests), size):
            chunk = list(requests[start : start + size])
            out.extend(await asyncio.to_thread(self._generate, chunk))
        return out

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        constraints: Sequence[Any] | None = None,
    ) -> list[tuple[list[int], list[float], str]]:
        """Sample continuations of token-id prompts: ``(ids, logprobs, finish_reason)`` each;
        row ``i`` follows ``constraints[i]`` when given (None: free)."""
        import torch

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        eos_ids = self._eos_ids()
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
                attention[row, width - len(ids) :] = 1
        from transformers import GenerationConfig

        from llm_gym.policies.hf_sampling import GeneratorSampling

        greedy = self.temperature == 0
        # A fresh config: the model's own (repetition penalty, min_p, ...) would sample from
        # another distribution than the logprobs (and TRL's loss) assume. Sampling is the last
        # processor's, from this batch's generator (generate's own draws from the global one).
        config = GenerationConfig(
            max_new_tokens=max(budgets),
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos_ids,
            return_dict_in_generate=True,
            output_logits=True,
        )
        processors: list[Any] = []
        masks = None
        if constraints is not None and any(c is not None for c in constraints):
            from llm_gym.policies.constraint import ConstraintProcessor

            masks = ConstraintProcessor(constraints)
            processors.append(masks)
        if not greedy:
            generator = None
            if self.seed is not None:
                generator = torch.Generator(device=device)
                generator.manual_seed(self.seed + self._batches)
            processors.append(GeneratorSampling(self.temperature, self.top_p, generator))
        self._batches += 1
        self.generate_calls += 1
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=config,
                logits_processor=processors,
            )
        sequences = output.sequences[:, width:].cpu()
        logits = torch.stack(output.logits, dim=1).float().cpu()  # (B, T, V)
        if masks is not None:  # the logprobs of the masked distribution each row sampled
            allowed = torch.stack(masks.masks, dim=1).cpu()[:, : logits.shape[1]]
            logits[..., : allowed.shape[2]].masked_fill_(~allowed, float("-inf"))
        scale = 1.0 if greedy else self.temperature
        logprobs_all = torch.log_softmax(logits / scale, dim=-1)
        chosen = logprobs_all.gather(-1, sequences[:, : logits.shape[1]].unsqueeze(-1)).squeeze(-1)
        results = []
        for row, budget in enumerate(budgets):
            ids = sequences[row].tolist()[:budget]
            finish = "length"
            for position, token in enumerate(ids):
                if token in eos_ids:
                    ids, finish = ids[: position + 1], "stop"
                    break
            results.append((ids, chosen[row, : len(ids)].tolist(), finish))
        return results

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def _generation(
        self,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        versions: list[int] | None = None,
    ) -> Generation:
        eos_ids = self._eos_ids()
        text_ids = ids[:-1] if finish == "stop" and ids and ids[-1] in eos_ids else ids
        text = self.tokenizer.decode(
            text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return Generation(
            text=text,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            policy_versions=versions,
        )

    def _eos_ids(self) -> list[int]:
        ids = []
        config = getattr(self.model, "generation_config", None)
        configured = getattr(config, "eos_token_id", None)
        if isinstance(configured, int):
            ids.append(configured)
        elif isinstance(configured, list | tuple):
            ids.extend(int(i) for i in configured)
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return sorted(set(ids))

    def _generate(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        prompts = [self._prompt_ids(r) for r in requests]
        budgets = [r.max_new_tokens or self.max_new_tokens for r in requests]
        constraints = [self.constraint_for(r) for r in requests]
        weights = self.weights
        if weights is None:
            return [
                self._generation(ids, logprobs, finish)
                for ids, logprobs, finish in self.generate_ids(prompts, budgets, constraints)
            ]
        with weights.in_use:  # a wave is a turn boundary for every episode in it
            version = weights.take_latest()
            generated = self.generate_ids(prompts, budgets, constraints)
        return [
            self._generation(ids, logprobs, finish, [version] * len(ids))
            for ids, logprobs, finish in generated
        ]
