"""``MultiTurnGRPOTrainer``: TRL's GRPOTrainer with whole multi-turn episodes as its samples.

TRL keeps the loss variants, clipping, KL, importance sampling, the optimizer, Accelerate, PEFT,
checkpoints and logging. The class overrides TRL's rollout seam,
``_generate_and_score_completions``: it runs groups of episodes (:mod:`trainers.grpo.collection`),
shapes their rewards and computes group-relative advantages (:mod:`trainers.grpo.rewards`,
:mod:`trainers.grpo.advantages`), and hands TRL the tensors its loss reads
(:mod:`trainers.grpo.scoring`, :mod:`trainers.grpo.batch`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from llm_gym.core.factories import Oracle, as_env_factory
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.pretrained import resolve_model_path
from llm_gym.rollout.episode import Episode
from trainers.async_rl.collect import AsyncCollector
from trainers.chat_template import grpo_start
from trainers.grpo.advantages import (
    advantage_estimator,
    refuse_per_turn_with_native_tools,
    warn_per_turn_fallback,
    without_void_episodes,
)
from trainers.grpo.agent_rollouts import AgentCollector, resolve_agent
from trainers.grpo.best_point import BestPoint, KeepBestCallback
from trainers.grpo.checkpoints import promote_staged_checkpoint, staging_dir
from trainers.grpo.collection import AsyncCallback, generation_policy, lockstep_pool, run_groups
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig
from trainers.grpo.difficulty import DifficultySampler
from trainers.grpo.dynamic_sampling import GroupPool
from trainers.grpo.health import HealthCallback
from trainers.grpo.metrics import (
    RolloutPart,
    completion_rows,
    extend_completion_logs,
    rollout_metrics,
)
from trainers.grpo.precision import SamplingCopy, settle_precision
from trainers.grpo.rejection_sampling import credit_rewards
from trainers.grpo.rewards import GroupRewards, check_reward_funcs
from trainers.grpo.rollouts import save_step_episodes
from trainers.grpo.scoring import (
    StaleTokens,
    shared_prefix_scores,
    training_batch,
    weigh_stale_advantages,
)
from trainers.grpo.validation import ValidationCallback, validate
from trainers.mixture.env import MixtureEnv
from trainers.mixture.run import MixtureRun

__all__ = ["MultiTurnGRPOTrainer"]


def _trl_required_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL requires a reward function; episode rewards come from the environments instead
    (:class:`~trainers.grpo.rewards.GroupRewards`), so TRL's list is never read."""
    return [0.0] * len(completions)


class MultiTurnGRPOTrainer(GRPOTrainer):
    """Multi-turn GRPO on llm_gym environments.

    Besides the rollout seam, it overrides TRL's scoring and loss seams
    (``_get_per_token_logps_and_entropies``: the rows' shared prefix scored once;
    ``_compute_loss``: async training's stale tokens weighed) and its checkpoint folder
    (``_get_output_dir``, for atomic checkpoints); the rest of its work is in functions of its
    state (:mod:`trainers.grpo.scoring`, :mod:`trainers.grpo.validation`) and in
    :class:`~trainers.grpo.rewards.GroupRewards`.

    Args:
        model: A model, or a path / hub id (default: ``args.model``).
        args: A :class:`MultiTurnGRPOConfig`.
        env_factory: Builds a fresh environment for each episode (``task -> Env``).
        tasks: The training tasks.
        val_tasks: Validation tasks (validated every ``args.validation_interval`` steps).
        envs: A mixture of environments instead of ``env_factory``, ``tasks`` and
            ``val_tasks``: each a :class:`~trainers.mixture.env.MixtureEnv` with its weight, tasks
            and settings; each step's groups are drawn by weight (:mod:`trainers.mixture.env`).
        processing_class: The tokenizer (default: loaded from the model's path).
        peft_config: A PEFT config (default: a LoRA config when ``args.use_lora``).
        oracle: The environment's scripted expert (only used by scripted policies).
        callbacks: Extra ``TrainerCallback`` s.
        reward_funcs: TRL-style reward functions added to the environment's reward, weighted by
            ``args.reward_weights`` (see :mod:`trainers.grpo.rewards`).
        agent, agent_scorer: Your agent instead of the episode loop, and what grades its final
            answers (:mod:`trainers.grpo.agent_rollouts`; None: the config's ``agent``, the env).
    """

    def __init__(
        self,
        model: Any = None,
        args: MultiTurnGRPOConfig | None = None,
        *,
        env_factory: Callable[[Task], Any] | None = None,
        tasks: Sequence[Task] | None = None,
        val_tasks: Sequence[Task] | None = None,
        envs: Sequence[MixtureEnv] | None = None,
        processing_class: Any = None,
        peft_config: Any = None,
        oracle: Oracle | None = None,
        callbacks: list[Any] | None = None,
        reward_funcs: Any = None,
        agent: Any = None,
        agent_scorer: Any = None,
    ) -> None:
        from datasets import Dataset

        if args is None or not isinstance(args, MultiTurnGRPOConfig):
            raise InvalidArgumentError("args must be a MultiTurnGRPOConfig.")
        if args.max_turns is None:
            raise InvalidArgumentError("max_turns is required: set it in the config.")
        model = model if model is not None else args.model
        if isinstance(model, str):  # a packaged model's name or a .gguf file: its HF folder
            model = resolve_model_path(model)
        if model is None:
            raise InvalidArgumentError("No model: pass model= or set the config's model field.")
        model, processing_class = grpo_start(model, processing_class, args)  # its chat template
        self.precision = settle_precision(args, model)  # before TRL builds the accelerator
        mixture, env_factory, tasks = MixtureRun.or_one_env(
            envs, env_factory, tasks, val_tasks, args
        )
        if len(tasks) < args.batch_size:
            raise InvalidArgumentError(
                f"Expected at least batch_size={args.batch_size} tasks, got {len(tasks)}."
            )
        if peft_config is None:
            peft_config = args.lora_config()
        dataset = Dataset.from_list(
            [{"prompt": task.prompt, "task_index": i} for i, task in enumerate(tasks)]
        )
        user_funcs = check_reward_funcs(reward_funcs)
        super().__init__(
            model=model,
            reward_funcs=user_funcs or [_trl_required_reward],
            args=args,
            train_dataset=dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=[*(callbacks or []), AsyncCallback(self), ValidationCallback(self)],
        )
        # TRL checked the user's weights against the user's functions
        weights = self.reward_weights.tolist() if user_funcs else []
        self.rewards = GroupRewards(args, user_funcs, weights)
        self.sampling_copy = SamplingCopy() if self.precision.sampling_bf16 else None
        self.record_metrics(self.precision.metrics())  # in the first step's record
        self.teacher: Any = None  # on-policy distillation's, built at the first batch
        # inside _compute_loss of an async micro-batch: what TRL's loss reads, the stale tokens
        self._stale: tuple[dict[str, Any], StaleTokens] | None = None
        self._staging_root: str | None = None  # inside _save_checkpoint
        self.health = HealthCallback(args.health_action, "rl")
        self.callback_handler.callbacks.insert(0, self.health)  # its keys reach the loggers
        self.env_factory = as_env_factory(env_factory)
        self.mixture = mixture
        if mixture is not None:  # each process its own share of the draw
            mixture.set_process(self.accelerator.process_index, self.accelerator.num_processes)
        if args.credit_assignment == "per_turn":
            starts = [(e.env_factory, e.tasks[0]) for e in mixture.envs] if mixture else []
            for factory, task in starts or [(self.env_factory, tasks[0])]:
                refuse_per_turn_with_native_tools(as_env_factory(factory), task)
        self.tasks = tasks
        self.val_tasks = list(val_tasks) if val_tasks is not None else []
        self.oracle = oracle
        self.validation_history: list[dict[str, Any]] = []
        self.best_point: BestPoint | None = None  # the point keep_best kept, when train ends
        self.add_callback(KeepBestCallback(self))  # after ValidationCallback: reads what it found
        self._last_collection_end: float | None = None
        self._async: AsyncCollector | None = None
        self._publish_seconds = 0.0
        self.difficulty = DifficultySampler.of(args, len(tasks))
        agent = resolve_agent(agent, args, mixture)
        self._agents = agent and AgentCollector(
            agent, self.env_factory, args, self.episode_tokenizer, agent_scorer
        )

    # --- state -------------------------------------------------------------------------------

    @property
    def grpo_args(self) -> MultiTurnGRPOConfig:
        """``args``, typed (``__init__`` accepts only a :class:`MultiTurnGRPOConfig`)."""
        assert isinstance(self.args, MultiTurnGRPOConfig)
        return self.args

    @property
    def episode_tokenizer(self) -> Any:
        """The tokenizer episodes are rendered with (a processor's, for multimodal models)."""
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    @property
    def pad_token_id(self) -> int:
        tokenizer = self.episode_tokenizer
        pad = tokenizer.pad_token_id
        return pad if pad is not None else tokenizer.eos_token_id

    def record_metrics(self, metrics: dict[str, float], mode: str = "train") -> None:
        """Values TRL averages into the next logged record of ``mode``."""
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def token_logps(
        self, model: Any, input_ids: Any, attention: Any, keep: int, batch_size: int
    ) -> Any:
        """Per-token logprobs of the last ``keep`` positions (scored as the loss scores)."""
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention, keep, batch_size=batch_size
        )
        return logps

    # --- generation --------------------------------------------------------------------------

    def collect(
        self,
        tasks: Sequence[Task],
        *,
        episodes_per_task: int,
        temperature: float,
        max_turns: int,
        sequential: bool = False,
        envs: Sequence[int] | None = None,
        validation: bool = False,
    ) -> list[list[Episode]]:
        """Run groups of episodes with the current weights; in a mixture ``envs`` names each
        task's environment (each runs with its own turn limit, in ``validation`` its
        validation one, and action format)."""
        if self._agents is not None:  # the agent plays against the served generation model
            return self._agents.collect(self, tasks, episodes_per_task, temperature, max_turns,
                                        sequential)  # fmt: skip
        with generation_policy(self, temperature, sequential) as policy:
            return run_groups(
                self, policy, tasks, episodes_per_task, max_turns, sequential, envs, validation
            )

    def validate(
        self, tasks: Sequence[Task] | None = None, *, env: str | None = None
    ) -> dict[str, float]:
        """Run the validation tasks once each (greedy by default) and log ``val/...`` metrics;
        in a mixture, environment ``env``'s (its own tasks by default), logged under
        ``val/<env>/``. Returns the summary."""
        return validate(self, tasks, env)

    def group_rewards(self, group: Sequence[Episode]) -> list[float]:
        """The rewards its advantages come from (:class:`~trainers.grpo.rewards.GroupRewards`)."""
        mode = "train" if self.model.training else "eval"
        return self.rewards(group, self.state, self._metrics[mode])

    # --- the override ------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        args = self.grpo_args
        mode = "train" if self.model.training else "eval"
        train_seconds = (
            time.perf_counter() - self._last_collection_end
            if self._last_collection_end is not None
            else float("nan")
        )
        start = time.perf_counter()
        # TRL's sampler hands each process rows for max_samples_per_episode x the episodes:
        # run the tasks of the first 1 / max_samples_per_episode of them.
        wanted = len(inputs) // (args.episodes_per_task * (args.max_samples_per_episode or 1))
        async_metrics: dict[str, float] = {}
        if args.is_async:
            pool, async_metrics = self._async_pool(wanted)
        else:
            pool = lockstep_pool(self, inputs, wanted)
        # Fill the batch: signal-carrying groups first, then those without a signal (their
        # advantages are all zero, so they only keep the batch shape).
        all_groups, all_rewards = pool.batch()
        rollout_seconds = time.perf_counter() - start
        # Episodes the infrastructure ended (the policy's endpoint failed, a generation hung)
        # say nothing about the policy: they neither train nor enter a baseline.
        groups, rewards = without_void_episodes(all_groups, all_rewards)
        turn_rewards = [[e.per_turn_rewards for e in group] for group in groups]
        advantages = advantage_estimator(args.credit_assignment)(
            credit_rewards(args, groups, rewards), turn_rewards, args.scale_rewards
        )
        if args.credit_assignment == "per_turn":
            warn_per_turn_fallback(groups)
        if args.log_completions:  # TRL's table (console, W&B) at its next log
            rows = completion_rows(groups, rewards, advantages.episode)
            extend_completion_logs(self._logs, rows, gather_object)
        batch, dropped, batch_metrics = training_batch(self, groups, advantages)
        async_metrics.update(batch_metrics)
        part: RolloutPart = (
            [e for g in all_groups for e in g],
            [r for g in all_rewards for r in g],
            pool.collected,
            pool.zero_variance,
            dropped,
        )
        parts = gather_object([part])
        metrics = rollout_metrics(parts, rollout_seconds, train_seconds)
        if args.save_episodes and mode == "train" and self.accelerator.is_main_process:
            policy = {"name": args.rollout_backend, "model": self.model.name_or_path}
            episodes = [e for p in parts for e in p[0]]
            step = self.state.global_step + 1
            factories = self.mixture.factories if self.mixture is not None else self.env_factory
            save_step_episodes(args.save_episodes, step, episodes, factories, policy)
        metrics.update(async_metrics)
        self.record_metrics(metrics, mode)  # gathered over processes
        self.record_metrics(self.rewards.judge_metrics(), mode)  # this process's
        self._last_collection_end = time.perf_counter()
        return batch

    def _async_pool(self, wanted: int) -> tuple[GroupPool, dict[str, float]]:
        """Take the batch's groups from the rollout worker (started at the first step, from
        the weights the run starts with); returns the pool and the ``async/...`` metrics,
        gathered over processes."""
        if self._async is None:
            self._async = AsyncCollector(self, self.env_factory, self.oracle, self._agents)
        publish_s = self._async.publish(self.state.global_step)  # when the callback did not
        self._publish_seconds += publish_s
        taken = self._async.take(wanted, self.group_rewards)
        metrics = self._async.metrics(taken, self._publish_seconds, self.accelerator)
        self._publish_seconds = 0.0
        assert taken.pool is not None
        return taken.pool, metrics

    def sync_generation_weights(self) -> None:
        """TRL's vLLM engine gets the current weights (the async publisher keeps it current)."""
        if self._async is not None:
            self._async.join()
        elif self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step

    def wait_for_publication(self) -> None:
        """Before an optimizer step: a background publication finishes reading the weights."""
        if self._async is not None:
            self._async.join()

    def publish_weights(self) -> None:
        """After an optimizer step (every process): the generators move to the new version."""
        if self._async is not None:
            self._publish_seconds += self._async.publish(self.state.global_step)

    def _stop_async(self) -> None:
        if self._async is not None:
            collector, self._async = self._async, None
            collector.close()

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``; async runs stop their rollout worker however it ends. A mixture
        resumed from a checkpoint continues its draw where the checkpoint left it."""
        if self.mixture is not None:
            resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
            self.mixture.resume(resume, self.args.output_dir)
        try:
            return super().train(*args, **kwargs)
        finally:
            self._stop_async()
            if self._agents is not None:
                self._agents.close()

    # --- checkpoints -------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the checkpoint to a hidden staging folder, then rename it into place, so a run
        killed mid-save never leaves a half-written ``checkpoint-N`` to resume from."""
        run_dir = self._get_output_dir(trial=trial)
        step = self.state.global_step
        self._staging_root = staging_dir(run_dir, step)
        try:
            super()._save_checkpoint(model, trial)
            if self.mixture is not None:  # each process its own position in the draw
                folder = f"{PREFIX_CHECKPOINT_DIR}-{step}"
                self.mixture.save(os.path.join(self._staging_root, folder))
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self.state.best_model_checkpoint = promote_staged_checkpoint(
                run_dir, step, self.state.best_model_checkpoint, self.args.save_total_limit
            )
        self.accelerator.wait_for_everyone()

    def _get_output_dir(self, trial: Any) -> str:
        """Transformers' run folder; while :meth:`_save_checkpoint` writes, its staging folder."""
        if self._staging_root is not None:
            return self._staging_root
        return super()._get_output_dir(trial)

    # --- scoring and the loss ----------------------------------------------------------------

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
        """TRL's scoring, with the rows' shared prefix run once where it applies
        (:func:`~trainers.grpo.scoring.shared_prefix_scores`); inside :meth:`_compute_loss` of
        a micro-batch with stale tokens, their advantages are weighed from these logprobs."""
        scored = shared_prefix_scores(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            extra_inputs=compute_aux_loss or any(v is not None for v in multimodal.values()),
        )
        if scored is None:
            scored = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )
        if self._stale is not None:
            inputs, stale = self._stale
            mean = weigh_stale_advantages(self, inputs, stale, scored[0])
            if mean is not None:
                mode = "train" if self.model.training else "eval"
                key = "async/off_policy" if self.grpo_args.is_async else "sampling/importance"
                self.record_metrics({f"{key}_weight_mean": mean}, mode)
        return scored

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        """TRL's loss; an async micro-batch with stale tokens has their advantages weighed
        first (:func:`~trainers.grpo.scoring.weigh_stale_advantages`), from the logprobs TRL's
        own forward pass computes, so no extra pass runs."""
        inputs, stale = StaleTokens.take(inputs)
        if stale is None:
            return super()._compute_loss(model, inputs)
        self._stale = (inputs, stale)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._stale = None
