"""``MultiTurnGRPOTrainer``: TRL's GRPOTrainer with whole multi-turn episodes as its samples.

TRL keeps the loss variants, clipping, KL, importance sampling, the optimizer, Accelerate, PEFT,
checkpoints and logging. This subclass replaces one method, ``_generate_and_score_completions``:
it runs groups of episodes with llm_gym's rollout engine (token-in/token-out, one batched
generation per wave), shapes the rewards (failed parse, soft overlong penalty), computes
group-relative advantages (per episode or per turn), applies overlong masking and dynamic
sampling, and hands TRL the tensors its loss reads. The pure parts live in
:mod:`trainers.advantages` (shaping, advantages, dynamic sampling's pool), :mod:`trainers.batch`
(episodes to tensors), :mod:`trainers.shared_prefix` (scoring), :mod:`trainers.rollout_metrics`
and :mod:`trainers.checkpoints` (atomic saves).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from llm_gym.core.factories import Oracle, as_env_factory
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.metrics import summarize_episodes
from llm_gym.policies import Policy, policy_from_spec
from llm_gym.rollout.episode import Episode
from trainers.advantages import (
    EpisodeOutcome,
    GroupPool,
    advantage_estimator,
    refill_tasks,
    shaped_reward,
)
from trainers.batch import group_rows, importance_sampling_ratio, rows_to_tensors
from trainers.checkpoints import promote_staged_checkpoint, staging_dir
from trainers.config import MultiTurnGRPOConfig
from trainers.rollout_metrics import RolloutPart, rollout_metrics, validation_metrics
from trainers.rollouts import collect_episode_groups
from trainers.shared_prefix import (
    cache_keyword,
    plan_shared_prefix,
    score_shared_prefix,
    shared_prefix_applies,
)

__all__ = ["MultiTurnGRPOTrainer"]


class _ValidationCallback(TrainerCallback):
    """Validate after every ``validation_interval``-th optimizer step (on every process)."""

    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        interval = getattr(args, "validation_interval", None)
        if self.trainer.val_tasks and interval and state.global_step % interval == 0:
            self.trainer.validate()


def _unused_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL requires a reward function; episode rewards come from the environments instead."""
    return [0.0] * len(completions)


class MultiTurnGRPOTrainer(GRPOTrainer):
    """Multi-turn GRPO on llm_gym environments.

    Args:
        model: A model, or a path / hub id (default: ``args.model``).
        args: A :class:`MultiTurnGRPOConfig`.
        env_factory: Builds a fresh environment for each episode (``task -> Env``).
        tasks: The training tasks.
        val_tasks: Validation tasks (validated every ``args.validation_interval`` steps).
        processing_class: The tokenizer (default: loaded from the model's path).
        peft_config: A PEFT config (default: a LoRA config when ``args.use_lora``).
        oracle: The environment's scripted expert (only used by scripted policies).
        callbacks: Extra ``TrainerCallback`` s.
    """

    def __init__(
        self,
        model: Any = None,
        args: MultiTurnGRPOConfig | None = None,
        *,
        env_factory: Callable[[Task], Any],
        tasks: Sequence[Task],
        val_tasks: Sequence[Task] | None = None,
        processing_class: Any = None,
        peft_config: Any = None,
        oracle: Oracle | None = None,
        callbacks: list[Any] | None = None,
    ) -> None:
        from datasets import Dataset

        if args is None or not isinstance(args, MultiTurnGRPOConfig):
            raise InvalidArgumentError("args must be a MultiTurnGRPOConfig.")
        if args.max_turns is None:
            raise InvalidArgumentError("max_turns is required: set it in the config.")
        model = model if model is not None else args.model
        if model is None:
            raise InvalidArgumentError("No model: pass model= or set the config's model field.")
        tasks = list(tasks)
        if len(tasks) < args.batch_size:
            raise InvalidArgumentError(
                f"Expected at least batch_size={args.batch_size} tasks, got {len(tasks)}."
            )
        if peft_config is None:
            peft_config = args.lora_config()
        dataset = Dataset.from_list(
            [{"prompt": task.prompt, "task_index": i} for i, task in enumerate(tasks)]
        )
        super().__init__(
            model=model,
            reward_funcs=[_unused_reward],
            args=args,
            train_dataset=dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=[*(callbacks or []), _ValidationCallback(self)],
        )
        self.env_factory = as_env_factory(env_factory)
        self.tasks = tasks
        self.val_tasks = list(val_tasks) if val_tasks is not None else []
        self.oracle = oracle
        self.validation_history: list[dict[str, Any]] = []
        self._last_collection_end: float | None = None

    # --- generation --------------------------------------------------------------------------

    @property
    def _episode_tokenizer(self) -> Any:
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _run_collection(
        self,
        policy: Policy,
        tasks: Sequence[Task],
        episodes_per_task: int,
        max_turns: int,
        sequential: bool,
    ) -> list[list[Episode]]:
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        return collect_episode_groups(
            self.env_factory,
            tasks,
            policy,
            args.rollout_settings(max_turns),
            episodes_per_task=episodes_per_task,
            action_format=args.action_format,
            oracle=self.oracle,
            tokenizer=self._episode_tokenizer,
            sequential=sequential,
        )

    def _collect(
        self,
        tasks: Sequence[Task],
        *,
        episodes_per_task: int,
        temperature: float,
        max_turns: int,
        sequential: bool = False,
    ) -> list[list[Episode]]:
        """Run groups of episodes with the current weights."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        if self.use_vllm:  # TRL's vLLM engine generates: publish the weights, then drive it
            if self.state.global_step != self._last_loaded_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            policy = policy_from_spec(args.rollout_backend, trainer=self, temperature=temperature)
            try:
                return self._run_collection(policy, tasks, episodes_per_task, max_turns, sequential)
            finally:
                policy.finish()
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            was_training = unwrapped.training
            unwrapped.eval()
            policy = policy_from_spec(
                args.rollout_backend,
                model=unwrapped,
                tokenizer=self._episode_tokenizer,
                temperature=temperature,
                top_p=args.top_p,
                max_new_tokens=args.max_tokens_per_turn,
                seed=None,
                max_batch_size=1 if sequential else None,
            )
            try:
                return self._run_collection(policy, tasks, episodes_per_task, max_turns, sequential)
            finally:
                policy.finish()
                unwrapped.train(was_training)

    # --- rewards and advantages ------------------------------------------------------------

    def _shaped(self, episode: Episode) -> float:
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        return shaped_reward(
            EpisodeOutcome.of(episode),
            max_model_length=args.max_model_length,
            max_turns=args.max_turns or 1,
            overlong_buffer=args.overlong_buffer,
            overlong_penalty_factor=args.overlong_penalty_factor,
        )

    # --- the override ------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        mode = "train" if self.model.training else "eval"
        train_seconds = (
            time.perf_counter() - self._last_collection_end
            if self._last_collection_end is not None
            else float("nan")
        )
        start = time.perf_counter()
        size = args.episodes_per_task
        # TRL's sampler hands each process rows for max_samples_per_episode x the episodes:
        # run the tasks of the first 1 / max_samples_per_episode of them.
        wanted = len(inputs) // (size * args.max_samples_per_episode)
        task_indices = [int(row["task_index"]) for row in inputs[::size]][:wanted]
        tasks = [self.tasks[i] for i in task_indices]

        pool = GroupPool(wanted)
        for attempt in range(args.max_sampling_attempts):
            if attempt > 0:
                # Every process collects in every round (generation may be collective: ZeRO-3,
                # FSDP, vLLM server); one whose batch is already full refills a single group.
                rank = self.accelerator.process_index
                seed = (args.task_seed, self.state.global_step, attempt, rank)
                tasks = refill_tasks(self.tasks, max(1, pool.deficit), seed)
            groups = self._collect(
                tasks,
                episodes_per_task=size,
                temperature=args.temperature,
                max_turns=args.max_turns or 1,
            )
            for group in groups:
                pool.add(group, [self._shaped(e) for e in group])
            deficit = torch.tensor([pool.deficit], device=self.accelerator.device)
            if args.max_sampling_attempts == 1 or self.accelerator.gather(deficit).max() == 0:
                break
        # Fill the batch: signal-carrying groups first, then zero-variance ones (their
        # advantages are all zero, so they only keep the batch shape).
        groups, rewards = pool.batch()
        rollout_seconds = time.perf_counter() - start

        turn_rewards = [[e.per_turn_rewards for e in group] for group in groups]
        advantages = advantage_estimator(args.credit_assignment)(
            rewards, turn_rewards, args.scale_rewards
        )
        pad_id = self._episode_tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self._episode_tokenizer.eos_token_id
        rows, dropped = group_rows(
            groups,
            advantages.episode,
            advantages.turns,
            overlong_masking=args.overlong_masking,
            max_rows=args.max_samples_per_episode,
            pad_id=pad_id,
        )
        device = self.accelerator.device
        batch = rows_to_tensors(rows, pad_id, device)
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._add_reference_logps(batch)
        batch.pop("sampling_per_token_logps")
        part = RolloutPart(
            episodes=[e for g in groups for e in g],
            shaped=[r for g in rewards for r in g],
            collected_groups=pool.collected,
            zero_variance=pool.zero_variance,
            dropped=dropped,
        )
        metrics = rollout_metrics(gather_object([part]), rollout_seconds, train_seconds)
        for key, value in metrics.items():  # gathered over processes
            self._metrics[mode][key].append(value)
        self._last_collection_end = time.perf_counter()
        return batch

    def _add_reference_logps(self, batch: dict[str, Any]) -> None:
        """``old_per_token_logps`` when off-policy, ``ref_per_token_logps`` when beta != 0."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        micro = args.per_device_train_batch_size
        generate_every = args.steps_per_generation * self.num_iterations
        correct = self.use_vllm and self.vllm_importance_sampling_correction
        with torch.no_grad():
            if args.gradient_accumulation_steps % generate_every != 0 or correct:
                batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, keep, batch_size=micro
                )
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

        Same values and gradients as TRL's full forward (see :mod:`trainers.shared_prefix`);
        TRL's path runs instead for multimodal or MoE-aux batches, for models wrapped or sharded
        for distributed training (DDP, FSDP, DeepSpeed), under gradient checkpointing (in the
        config or on the model) and when the shared prefix is short.
        """
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]

        def trl_scoring() -> tuple[Any, Any, Any]:
            return super(MultiTurnGRPOTrainer, self)._get_per_token_logps_and_entropies(
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
            or getattr(unwrapped, "is_gradient_checkpointing", False),
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

    # --- validation --------------------------------------------------------------------------

    def validate(self, tasks: Sequence[Task] | None = None) -> dict[str, float]:
        """Run the validation tasks once each (greedy by default) and log ``val/...`` metrics."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        tasks = list(tasks if tasks is not None else self.val_tasks)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = tasks[rank::world]
        # Every process collects, also one with no tasks: generation may be collective.
        groups = self._collect(
            mine,
            episodes_per_task=1,
            temperature=args.val_temperature,
            max_turns=args.validation_max_turns or 1,
            sequential=args.sequential_validation,
        )
        episodes = [e for part in gather_object([[e for g in groups for e in g]]) for e in part]
        summary = summarize_episodes(episodes)
        record = {"step": self.state.global_step, **summary}
        self.validation_history.append(record)
        # logged with the step's own record (TRL averages _metrics lists)
        for key, value in validation_metrics(summary).items():
            self._metrics["train"][key].append(value)
        return summary

    # --- checkpoints -------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the checkpoint to a hidden staging folder, then rename it into place, so a run
        killed mid-save never leaves a half-written ``checkpoint-N`` to resume from."""
        run_dir = self._get_output_dir(trial=trial)
        step = self.state.global_step
        staging_root = staging_dir(run_dir, step)
        original = self._get_output_dir
        self._get_output_dir = lambda trial=None: staging_root  # type: ignore[method-assign]
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._get_output_dir = original  # type: ignore[method-assign]
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self.state.best_model_checkpoint = promote_staged_checkpoint(
                run_dir, step, self.state.best_model_checkpoint, self.args.save_total_limit
            )
        self.accelerator.wait_for_everyone()
