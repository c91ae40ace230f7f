"""The trainer's scoring: the batch, reference, behaviour and teacher logprobs, and scoring with
a shared prefix.

A mixin of :class:`trainers.grpo.trainer.MultiTurnGRPOTrainer` (before TRL's ``GRPOTrainer`` in its
bases): :meth:`ScoringMixin._training_batch` turns episode groups into the tensors TRL's loss
reads (with on-policy distillation's teacher advantages, :mod:`trainers.distillation.config`);
:meth:`ScoringMixin._add_reference_logps` adds what TRL's loss reads besides the batch
(``old_per_token_logps``, ``ref_per_token_logps``, vLLM's importance-sampling ratio) and applies
async training's off-policy correction; :meth:`ScoringMixin._get_per_token_logps_and_entropies`
runs the rows' shared prefix once (:mod:`trainers.grpo.shared_prefix`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from trainers.distillation.config import build_teacher, distill_batch
from trainers.grpo.batch import (
    episode_batch,
    importance_sampling_ratio,
    logprob_gap,
    off_policy_weights,
    pad_rows,
    silent_rows_skippable,
    stale_token_mask,
    without_silent_rows,
)
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig
from trainers.grpo.shared_prefix import (
    cache_keyword,
    plan_shared_prefix,
    score_shared_prefix,
    shared_prefix_applies,
)

__all__ = ["ScoringMixin"]


class ScoringMixin:
    """Scoring for :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer` (see the module
    docstring)."""

    _teacher: Any = None

    def _training_batch(
        self, groups: Sequence[Sequence[Any]], advantages: Any
    ) -> tuple[dict[str, Any], int, dict[str, float]]:
        """The step's batch from its episode groups and their advantages, the samples dropped
        over ``max_samples_per_episode``, and metrics (distillation's, async's)."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[attr-defined]
        tokenizer = self._episode_tokenizer  # type: ignore[attr-defined]
        pad_id = (
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else (tokenizer.eos_token_id)
        )
        batch, dropped = episode_batch(
            groups,
            advantages.episode,
            advantages.turns,
            overlong_masking=args.overlong_masking,
            max_rows=args.max_samples_per_episode,
            pad_id=pad_id,
        )
        accelerator = self.accelerator  # type: ignore[attr-defined]
        skip_silent = args.skip_silent_rows and silent_rows_skippable(
            loss_type=self.loss_type,  # type: ignore[attr-defined]
            beta=self.beta,  # type: ignore[attr-defined]
            top_entropy_quantile=self.top_entropy_quantile,  # type: ignore[attr-defined]
            entropy_bonus=bool(getattr(self, "_entropy_bonus_enabled", False)),
            aux_loss=bool(getattr(self, "aux_loss_enabled", False)),
            per_token_advantages_added=args.distillation_settings is not None,
        )
        if skip_silent:  # the same loss and gradients, without their passes
            batch, loss_tokens = without_silent_rows(batch)
        else:
            loss_tokens = int(batch["tool_mask"].sum())
        # As many rows on every rank (a row per sample varies; void episodes leave gaps), in
        # whole micro-batches; at least the batch TRL expects unless silent rows were left out.
        most = accelerator.gather(
            torch.tensor([len(batch["advantages"])], device=accelerator.device)
        )
        expected = args.per_device_train_batch_size * args.steps_per_generation
        batch = pad_rows(
            batch,
            multiple=args.steps_per_generation,
            at_least=int(most.max()) if skip_silent else max(int(most.max()), expected),
            pad_id=pad_id,
        )
        batch = {key: tensor.to(accelerator.device) for key, tensor in batch.items()}
        metrics: dict[str, float] = {}
        settings = args.distillation_settings
        if settings is not None:
            start = time.perf_counter()
            if self._teacher is None:
                self._teacher = build_teacher(settings, accelerator.device)
            kl_sum, tokens = distill_batch(batch, self._teacher, settings)
            totals = (
                accelerator.gather(
                    torch.tensor([kl_sum, tokens], dtype=torch.float64, device=accelerator.device)
                )
                .view(-1, 2)
                .sum(0)
            )
            metrics["distill/reverse_kl"] = float(totals[0] / totals[1].clamp(min=1))
            metrics["distill/teacher_s"] = time.perf_counter() - start
        # The loss tokens of every row, silent ones left out of the passes included.
        count = torch.tensor(loss_tokens, dtype=torch.long, device=accelerator.device)
        batch["num_items_in_batch"] = accelerator.gather(count).sum()
        metrics.update(self._add_reference_logps(batch))
        batch.pop("sampling_per_token_logps")
        return batch, dropped, metrics

    def _add_reference_logps(self, batch: dict[str, Any]) -> dict[str, float]:
        """``old_per_token_logps`` when off-policy, ``ref_per_token_logps`` when beta != 0,
        vLLM's importance-sampling ratio, and, when older weights sampled some tokens of an
        async batch, what :meth:`_compute_loss` needs to correct them (``behaviour_logps``,
        ``stale_mask``). Returns the async metrics."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[attr-defined]
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        micro = args.per_device_train_batch_size
        generate_every = args.steps_per_generation * self.num_iterations
        correct = self.use_vllm and self.vllm_importance_sampling_correction
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        versions = batch.pop("policy_versions", None)
        stale = None
        if args.is_async and versions is not None:
            stale = stale_token_mask(versions, self.state.global_step, loss_mask)
        metrics: dict[str, float] = {}
        if stale is not None:
            metrics["async/stale_token_ratio"] = float(stale.sum() / loss_mask.sum().clamp(min=1))
        # In-process generators: correct only the tokens older weights sampled (the current
        # weights' tokens are the current policy's, bit for bit). vLLM: TRL's correction below
        # covers every token (kernel mismatch and staleness alike).
        fold = (
            stale is not None
            and not self.use_vllm
            and self.vllm_importance_sampling_correction
            and bool(stale.any())
        )
        if fold:  # weighed in the loss, from the logprobs its own forward pass computes
            batch["behaviour_logps"] = batch["sampling_per_token_logps"]
            batch["stale_mask"] = stale
        with torch.no_grad():
            if args.gradient_accumulation_steps % generate_every != 0 or correct:
                batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, keep, batch_size=micro
                )
            if "old_per_token_logps" in batch:  # the sampler's logprobs against the trainer's
                gap = logprob_gap(
                    batch["old_per_token_logps"], batch["sampling_per_token_logps"], loss_mask
                )  # gathered: every process reads the same step log (health checks stop all)
                gaps = self.accelerator.gather(torch.tensor([gap], device=loss_mask.device))
                metrics["sampling/sampling_logp_difference/mean"] = float(gaps[:, 0].mean())
                metrics["sampling/sampling_logp_difference/max"] = float(gaps[:, 1].max())
            if correct:  # vLLM's sampler vs the trainer's logprobs, as TRL corrects it
                batch["importance_sampling_ratio"] = importance_sampling_ratio(
                    batch["old_per_token_logps"],
                    batch["sampling_per_token_logps"],
                    batch["completion_mask"] * batch["tool_mask"],
                    self.vllm_importance_sampling_mode,
                    self.vllm_importance_sampling_clip_min,
                    self.vllm_importance_sampling_clip_max,
                )
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref_model = self.ref_model
                    batch["ref_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                        ref_model, input_ids, attention, keep, batch_size=micro
                    )
                else:
                    from trl.trainer.utils import use_adapter

                    unwrapped = self.accelerator.unwrap_model(self.model)
                    name = "ref" if "ref" in getattr(unwrapped, "peft_config", {}) else None
                    with use_adapter(unwrapped, adapter_name=name):
                        batch["ref_per_token_logps"], _, _ = (
                            self._get_per_token_logps_and_entropies(
                                self.model, input_ids, attention, keep, batch_size=micro
                            )
                        )
        return metrics

    # --- scoring ---------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> tuple[Any, Any, Any]:
        """TRL's scoring, with the rows' shared prefix run once (``args.shared_prefix``).

        Same values and gradients as TRL's full forward (see :mod:`trainers.grpo.shared_prefix`);
        TRL's path runs instead for multimodal or MoE-aux batches, for models wrapped or sharded
        for distributed training (DDP, FSDP, DeepSpeed), under gradient checkpointing (in the
        config or on the model) and when the shared prefix is short.
        """
        args: MultiTurnGRPOConfig = self.args  # type: ignore[attr-defined]

        def trl_scoring() -> tuple[Any, Any, Any]:
            return super(ScoringMixin, self)._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )

        unwrapped = self.accelerator.unwrap_model(model)
        if not shared_prefix_applies(
            enabled=args.shared_prefix,
            wrapped=unwrapped is not model,
            sharded=self.is_fsdp_enabled or self.is_deepspeed_enabled,
            gradient_checkpointing=args.gradient_checkpointing
            or getattr(unwrapped, "is_activation_checkpointing", False),
            extra_inputs=compute_aux_loss or any(v is not None for v in multimodal.values()),
        ):
            return trl_scoring()
        plan = plan_shared_prefix(
            input_ids, attention_mask, logits_to_keep, args.shared_prefix_min_length
        )
        if plan is None:
            return trl_scoring()
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        scored = score_shared_prefix(
            model,
            plan,
            keyword=cache_keyword(base.forward),  # PEFT's forward takes it through **kwargs
            batch_size=batch_size or input_ids.size(0),
            compute_entropy=compute_entropy,
            autocast=self.accelerator.autocast,
        )
        if scored is None:  # a model that returns no cache here: score it TRL's way
            return trl_scoring()
        logps, entropies = scored
        return logps, entropies, None

    # --- the loss ------------------------------------------------------------------------------

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        """TRL's loss; in a micro-batch with stale tokens, each of their advantages first times
        :func:`~trainers.grpo.batch.off_policy_weights` of the policy's logprobs (TRL's own forward
        pass, so no extra one: ``old_per_token_logps`` when TRL computed them, else the
        detached current ones, the same values at the first iteration) over the sampler's.

        Every GRPO loss TRL offers is positively homogeneous in the advantage, so this is
        ``per_token_loss * weight``, as TRL applies vLLM's importance-sampling ratio.
        """
        if "behaviour_logps" not in inputs:
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        inputs = dict(inputs)
        behaviour = inputs.pop("behaviour_logps")
        stale = inputs.pop("stale_mask")
        loss_mask = inputs["completion_mask"] * inputs["tool_mask"]
        scoring = self._get_per_token_logps_and_entropies

        def weighed_scoring(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
            logps, entropies, aux = scoring(*args, **kwargs)
            target = inputs.get("old_per_token_logps")
            target = logps.detach() if target is None else target
            weights = off_policy_weights(
                target,
                behaviour,
                loss_mask,
                stale,
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            inputs["advantages"] = inputs["advantages"] * weights
            if stale.any():
                mode = "train" if self.model.training else "eval"
                mean = weights.expand_as(stale)[stale > 0].float().mean()
                self._metrics[mode]["async/off_policy_weight_mean"].append(float(mean))
            return logps, entropies, aux

        self._get_per_token_logps_and_entropies = weighed_scoring  # type: ignore[method-assign]
        try:
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        finally:
            del self._get_per_token_logps_and_entropies
