"""``MultiTurnGRPOTrainer``: TRL's GRPOTrainer with whole multi-turn episodes as its samples.

TRL keeps the loss variants, clipping, KL, importance sampling, the optimizer, Accelerate, PEFT,
checkpoints and logging. This subclass replaces one method, ``_generate_and_score_completions``:
it runs groups of episodes with llm_gym's rollout engine (token-in/token-out, one batched
generation per wave), shapes the rewards (failed parse, soft overlong penalty), computes
group-relative advantages (per episode or per turn), applies overlong masking and dynamic
sampling, and hands TRL the tensors its loss reads. The pure parts live in
:mod:`trainers.grpo.advantages` (shaping, advantages), :mod:`trainers.grpo.dynamic_sampling` (its
pool and refills), :mod:`trainers.grpo.batch` (episodes to tensors),
:mod:`trainers.grpo.shared_prefix` (scoring), :mod:`trainers.grpo.metrics` and
:mod:`trainers.grpo.checkpoints` (atomic saves).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from llm_gym.core.factories import Oracle, as_env_factory
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.trl_rollout import generation_model
from llm_gym.policies import Policy, policy_from_spec
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
from trainers.grpo.checkpoints import promote_staged_checkpoint, staging_dir
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig
from trainers.grpo.difficulty import DifficultySampler, group_outcomes
from trainers.grpo.dynamic_sampling import GroupPool, refill_tasks
from trainers.grpo.health import HealthCallback
from trainers.grpo.metrics import (
    RolloutPart,
    completion_rows,
    extend_completion_logs,
    rollout_metrics,
)
from trainers.grpo.rejection_sampling import credit_rewards, group_signal
from trainers.grpo.rewards import RewardsMixin, check_reward_funcs
from trainers.grpo.rollouts import (
    collect_episode_groups,
    collect_mixture_groups,
    save_step_episodes,
    torch_threads,
)
from trainers.grpo.scoring import ScoringMixin
from trainers.grpo.validation import ValidationCallback, ValidationMixin
from trainers.mixture.env import MixtureEnv
from trainers.mixture.run import MixtureRun

__all__ = ["MultiTurnGRPOTrainer"]


class _AsyncCallback(TrainerCallback):
    """Async training: publish the weights right after each optimizer step, and let a
    background publication finish reading them before the next step changes them."""

    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer._async is not None:
            self.trainer._async.join()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._publish_weights()


def _unzip(picks: list[tuple[int, Task]]) -> tuple[list[int], list[Task]]:
    return [env for env, _ in picks], [task for _, task in picks]


def _unused_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL requires a reward function; episode rewards come from the environments instead."""
    return [0.0] * len(completions)


class MultiTurnGRPOTrainer(ValidationMixin, ScoringMixin, RewardsMixin, GRPOTrainer):
    """Multi-turn GRPO on llm_gym environments.

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
        super().__init__(
            model=model,
            reward_funcs=check_reward_funcs(reward_funcs) or [_unused_reward],
            args=args,
            train_dataset=dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=[*(callbacks or []), _AsyncCallback(self), ValidationCallback(self)],
        )
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
        self._last_collection_end: float | None = None
        self._async: AsyncCollector | None = None
        self._publish_seconds = 0.0
        self._difficulty = DifficultySampler.of(args, len(tasks))
        agent = resolve_agent(agent, args, mixture)
        self._agents = agent and AgentCollector(
            agent, self.env_factory, args, self._episode_tokenizer, agent_scorer
        )

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
        envs: Sequence[int] | None = None,
        validation: bool = False,
    ) -> list[list[Episode]]:
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        if envs is not None:  # a mixture: each environment with its own settings
            assert self.mixture is not None
            return collect_mixture_groups(
                self.mixture.parts(list(zip(envs, tasks, strict=True)), validation),
                policy,
                episodes_per_task=episodes_per_task,
                oracle=self.oracle,
                tokenizer=self._episode_tokenizer,
                sequential=sequential,
            )
        return collect_episode_groups(
            self.env_factory,
            tasks,
            policy,
            args.rollout_settings(max_turns),
            episodes_per_task=episodes_per_task,
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
        envs: Sequence[int] | None = None,
        validation: bool = False,
    ) -> list[list[Episode]]:
        """Run groups of episodes with the current weights; in a mixture ``envs`` names each
        task's environment (each runs with its own turn limit, in ``validation`` its
        validation one, and action format)."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        if self._agents is not None:  # the agent plays against the served generation model
            return self._agents.collect(self, tasks, episodes_per_task, temperature, max_turns,
                                        sequential)  # fmt: skip
        if self.use_vllm:  # TRL's vLLM engine generates: publish the weights, then drive it
            if self._async is not None:  # the async publisher keeps vLLM current
                self._async.join()
            elif self.state.global_step != self._last_loaded_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            policy = policy_from_spec(args.rollout_backend, trainer=self, temperature=temperature)
            try:
                return self._run_collection(
                    policy, tasks, episodes_per_task, max_turns, sequential, envs, validation
                )
            finally:
                policy.finish()
        with (
            generation_model(self) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
            torch_threads(
                args.generator_threads if self.accelerator.device.type == "cpu" else None
            ),
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
                return self._run_collection(
                    policy, tasks, episodes_per_task, max_turns, sequential, envs, validation
                )
            finally:
                policy.finish()
                unwrapped.train(was_training)

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
        # TRL's sampler hands each process rows for max_samples_per_episode x the episodes:
        # run the tasks of the first 1 / max_samples_per_episode of them.
        wanted = len(inputs) // (args.episodes_per_task * (args.max_samples_per_episode or 1))
        async_metrics: dict[str, float] = {}
        if args.is_async:
            pool, async_metrics = self._async_pool(wanted)
        else:
            pool = self._lockstep_pool(inputs, wanted)
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
        batch, dropped, batch_metrics = self._training_batch(groups, advantages)
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
        for key, value in metrics.items():  # gathered over processes
            self._metrics[mode][key].append(value)
        self._log_judge_metrics(mode)
        self._last_collection_end = time.perf_counter()
        return batch

    def _lockstep_pool(self, inputs: list[dict[str, Any]], wanted: int) -> GroupPool:
        """Collect the batch's groups now, with the current weights (dynamic sampling refills
        up to ``max_sampling_attempts`` rounds)."""
        args: MultiTurnGRPOConfig = self.args  # type: ignore[assignment]
        size, rank = args.episodes_per_task, self.accelerator.process_index
        mixture = self.mixture
        envs, indices = None, None
        if mixture is not None:  # the mixture's stratified draw, not TRL's sampler
            envs, tasks = _unzip(mixture.step_picks(self.state.global_step, wanted))
        else:
            indices = [int(row["task_index"]) for row in inputs[::size]][:wanted]
            if self._difficulty is not None:  # the step's tasks by estimated difficulty
                indices, saved = self._difficulty.draw(
                    wanted, (args.task_seed, self.state.global_step, rank)
                )
                for key, value in self._difficulty.metrics(saved).items():
                    self._metrics["train"][key].append(value)
            tasks = [self.tasks[i] for i in indices]
        pool = GroupPool(wanted, signal=group_signal(args))
        for attempt in range(args.max_sampling_attempts):
            if attempt > 0:
                # Every process collects in every round (generation may be collective: ZeRO-3,
                # FSDP, vLLM server); one whose batch is already full refills a single group.
                seed = (args.task_seed, self.state.global_step, attempt, rank)
                if mixture is not None:
                    envs, tasks = _unzip(mixture.refill_picks(max(1, pool.deficit), seed))
                else:
                    indices = refill_tasks(range(len(self.tasks)), max(1, pool.deficit), seed)
                    tasks = [self.tasks[i] for i in indices]
            groups = self._collect(
                tasks,
                episodes_per_task=size,
                temperature=args.temperature,
                max_turns=args.max_turns or 1,
                envs=envs,
            )
            for group in groups:
                pool.add(group, self._group_rewards(group))
            if self._difficulty is not None and indices is not None:  # every process learns
                outcomes = gather_object([group_outcomes(indices, groups)])
                self._difficulty.add([o for part in outcomes for o in part])
            deficit = torch.tensor([pool.deficit], device=self.accelerator.device)
            if args.max_sampling_attempts == 1 or self.accelerator.gather(deficit).max() == 0:
                break
        return pool

    def _async_pool(self, wanted: int) -> tuple[GroupPool, dict[str, float]]:
        """Take the batch's groups from the rollout worker (started at the first step, from
        the weights the run starts with); returns the pool and the ``async/...`` metrics,
        gathered over processes."""
        if self._async is None:
            self._async = AsyncCollector(self, self.env_factory, self.oracle)
        publish_s = self._async.publish(self.state.global_step)  # when the callback did not
        self._publish_seconds += publish_s
        taken = self._async.take(wanted, self._group_rewards)
        metrics = self._async.metrics(taken, self._publish_seconds, self.accelerator)
        self._publish_seconds = 0.0
        assert taken.pool is not None
        return taken.pool, metrics

    def _publish_weights(self) -> None:
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
        staging_root = staging_dir(run_dir, step)
        original = self._get_output_dir
        self._get_output_dir = lambda trial=None: staging_root  # type: ignore[method-assign]
        try:
            super()._save_checkpoint(model, trial)
            if self.mixture is not None:  # each process its own position in the draw
                self.mixture.save(os.path.join(staging_root, f"{PREFIX_CHECKPOINT_DIR}-{step}"))
        finally:
            self._get_output_dir = original  # type: ignore[method-assign]
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self.state.best_model_checkpoint = promote_staged_checkpoint(
                run_dir, step, self.state.best_model_checkpoint, self.args.save_total_limit
            )
        self.accelerator.wait_for_everyone()
