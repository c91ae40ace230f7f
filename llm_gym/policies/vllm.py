"""Generation through TRL's vLLM backend (server or colocate mode), as an llm_gym ``Policy``.

The trainer creates it through the registry (``policy_from_spec("vllm", trainer=...)``); it needs
the training stack (accelerate), so :mod:`llm_gym.policies` does not import it eagerly.

Each wave of the rollout engine becomes one ``vllm_generation.generate`` call with the exact
token ids the episodes hold (token-in/token-out), returning the sampled ids and their logprobs.

vLLM's server mode (and tensor-parallel colocate mode) generates collectively: every process must
call ``generate`` the same number of times. Processes finish their episodes after different
numbers of waves, so each wave starts with a collective "still active?" round, and a process
that is done keeps answering with empty batches until every process is done (:meth:`drain`).

The real path needs vLLM and a GPU; CI has neither, so it runs in the GPU check script
(``benchmarks/gpu_check.py``). The default tests run this class against a stand-in for TRL's
generation object (tests/test_vllm_policy.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from accelerate.utils import gather_object

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.base import Generation, Policy, PolicyRequest

__all__ = ["VLLMPolicy", "generation_lock"]


def generation_lock(generation: Any) -> threading.Lock:
    """The one lock of a TRL vLLM generation object: every ``generate`` call and every weight
    sync through it takes it (a call sets the sampler's fields, and colocate mode shares one
    engine), whichever policy or thread makes the call."""
    with _LOCKS_LOCK:
        lock = getattr(generation, "_llm_gym_lock", None)
        if lock is None:
            lock = threading.Lock()
            generation._llm_gym_lock = lock
        return lock


_LOCKS_LOCK = threading.Lock()


class VLLMPolicy(Policy):
    """A policy backed by ``trainer.vllm_generation`` (TRL's vLLM client or colocated engine)."""

    name = "vllm"

    def __init__(
        self, trainer: Any, *, temperature: float, version: Callable[[], int] | None = None
    ) -> None:
        self.trainer = trainer
        self.generation = trainer.vllm_generation
        self.tokenizer = trainer.processing_class
        self.temperature = temperature
        self.version = version
        """Async training: the weight version the engine holds, read inside the lock at each
        call and stamped on every token it samples (``Generation.policy_versions``)."""
        self._lock = generation_lock(self.generation)
        accelerator = trainer.accelerator
        tensor_parallel = getattr(self.generation, "tensor_parallel_size", 1) or 1
        self.collective = accelerator.num_processes > 1 and (
            self.generation.mode == "server" or tensor_parallel > 1
        )

    @classmethod
    def from_spec(
        cls,
        argument: str = "",
        *,
        trainer: Any = None,
        temperature: float = 1.0,
        version: Callable[[], int] | None = None,
    ) -> VLLMPolicy:
        """``vllm`` inside a trainer that set up TRL's vLLM generation (``use_vllm=True``)."""
        if argument or trainer is None or getattr(trainer, "vllm_generation", None) is None:
            raise InvalidArgumentError(
                "The vllm policy runs inside MultiTurnGRPOTrainer with use_vllm=True (it needs "
                "trainer=, whose vllm_generation generates); for a served vLLM model use "
                "'openai:MODEL@URL'."
            )
        return cls(trainer, temperature=temperature, version=version)

    def _still_active(self, active: bool) -> bool:
        return any(gather_object([active])) if self.collective else active

    def _generate(self, prompts: list[list[int]], budget: int) -> tuple[list, list, int | None]:
        with self._lock:
            version = self.version() if self.version is not None else None
            return (*self._generate_locked(prompts, budget), version)

    def _generate_locked(self, prompts: list[list[int]], budget: int) -> tuple[list, list]:
        generation = self.generation
        saved = generation.temperature, generation.max_completion_length
        generation.temperature = self.temperature if self.temperature > 0 else 1e-6
        generation.max_completion_length = budget
        try:
            _, completion_ids, logprobs, _ = generation.generate(
                prompts=prompts, images=None, num_generations=1
            )
        finally:
            generation.temperature, generation.max_completion_length = saved
        return completion_ids, logprobs

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        self._still_active(True)
        prompts = [list(r.prompt_ids or []) for r in requests]
        budget = max((r.max_new_tokens or 256) for r in requests)
        completion_ids, logprobs, version = await asyncio.to_thread(self._generate, prompts, budget)
        eos = set(self.trainer.eos_token_ids)
        out = []
        for ids, lps in zip(completion_ids, logprobs, strict=True):
            ids = list(ids)
            finish = "stop" if ids and ids[-1] in eos else "length"
            text_ids = ids[:-1] if finish == "stop" else ids
            text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
            out.append(
                Generation(
                    text=text,
                    token_ids=ids,
                    logprobs=[float(lp[0]) for lp in lps],
                    finish_reason=finish,
                    policy_versions=None if version is None else [version] * len(ids),
                )
            )
        return out

    def finish(self) -> None:
        """:meth:`drain`: the collection is over here; serve the others' rounds."""
        self.drain()

    def drain(self) -> None:
        """Keep answering the collective rounds with empty batches until every process is done."""
        while self._still_active(False):
            self._generate([], 1)
