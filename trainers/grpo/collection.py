"""The trainer's episode collection: the generation policy from its current weights, the
groups a step or a validation plays, and a lockstep step's pool with dynamic sampling.

Functions of :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer`'s state: the trainer's
``collect`` runs :func:`generation_policy` and :func:`run_groups`; its rollout seam fills a
lockstep batch with :func:`lockstep_pool` (async runs take theirs from the rollout worker).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from llm_gym.core.task import Task
from llm_gym.integrations.trl.rollout import generation_model
from llm_gym.policies import Policy, policy_from_spec
from llm_gym.rollout.episode import Episode
from trainers.grpo.difficulty import group_outcomes
from trainers.grpo.dynamic_sampling import GroupPool, refill_tasks
from trainers.grpo.rejection_sampling import group_signal
from trainers.grpo.rollouts import collect_episode_groups, collect_mixture_groups, torch_threads

if TYPE_CHECKING:
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

__all__ = ["AsyncCallback", "generation_policy", "lockstep_pool", "run_groups", "sampling_model"]


class AsyncCallback(TrainerCallback):
    """Async training: publish the weights right after each optimizer step, and let a
    background publication finish reading them before the next step changes them."""

    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.wait_for_publication()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.publish_weights()


@contextlib.contextmanager
def generation_policy(
    trainer: MultiTurnGRPOTrainer, temperature: float, sequential: bool
) -> Iterator[Policy]:
    """The policy that samples with the trainer's current weights: TRL's vLLM engine (its
    weights synced first) or the model unwrapped for generation (its bf16 copy when the run
    samples in bf16: :func:`sampling_model`), in eval mode, with
    ``generator_threads`` torch threads on CPU; finished and restored on exit."""
    args = trainer.grpo_args
    if trainer.use_vllm:  # TRL's vLLM engine generates: publish the weights, then drive it
        trainer.sync_generation_weights()
        policy = policy_from_spec(args.rollout_backend, trainer=trainer, temperature=temperature)
        try:
            yield policy
        finally:
            policy.finish()
        return
    cpu = trainer.accelerator.device.type == "cpu"
    with (
        generation_model(trainer) as unwrapped,
        torch.no_grad(),
        trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
        torch_threads(args.generator_threads if cpu else None),
    ):
        was_training = unwrapped.training
        unwrapped.eval()
        policy = policy_from_spec(
            args.rollout_backend,
            model=sampling_model(trainer, unwrapped),
            tokenizer=trainer.episode_tokenizer,
            temperature=temperature,
            top_p=args.top_p,
            max_new_tokens=args.max_tokens_per_turn,
            seed=None,
            max_batch_size=1 if sequential else None,
        )
        try:
            yield policy
        finally:
            policy.finish()
            unwrapped.train(was_training)


def sampling_model(trainer: MultiTurnGRPOTrainer, unwrapped: Any) -> Any:
    """The model an in-process sampler runs: the trainer's own, or, when the run samples in
    bf16, its bf16 copy holding the current weights
    (:class:`~trainers.grpo.precision.SamplingCopy`)."""
    copy = trainer.sampling_copy
    return unwrapped if copy is None else copy.of(unwrapped)


def run_groups(
    trainer: MultiTurnGRPOTrainer,
    policy: Policy,
    tasks: Sequence[Task],
    episodes_per_task: int,
    max_turns: int,
    sequential: bool,
    envs: Sequence[int] | None = None,
    validation: bool = False,
) -> list[list[Episode]]:
    """One group of ``episodes_per_task`` episodes per task; in a mixture ``envs`` names each
    task's environment, which runs with its own settings."""
    if envs is not None:
        assert trainer.mixture is not None
        return collect_mixture_groups(
            trainer.mixture.parts(list(zip(envs, tasks, strict=True)), validation),
            policy,
            episodes_per_task=episodes_per_task,
            oracle=trainer.oracle,
            tokenizer=trainer.episode_tokenizer,
            sequential=sequential,
        )
    return collect_episode_groups(
        trainer.env_factory,
        tasks,
        policy,
        trainer.grpo_args.rollout_settings(max_turns),
        episodes_per_task=episodes_per_task,
        oracle=trainer.oracle,
        tokenizer=trainer.episode_tokenizer,
        sequential=sequential,
    )


def _unzip(picks: list[tuple[int, Task]]) -> tuple[list[int], list[Task]]:
    return [env for env, _ in picks], [task for _, task in picks]


def lockstep_pool(
    trainer: MultiTurnGRPOTrainer, inputs: list[dict[str, Any]], wanted: int
) -> GroupPool:
    """Collect the batch's ``wanted`` groups now, with the current weights (dynamic sampling
    refills up to ``max_sampling_attempts`` rounds); ``inputs`` are TRL's sampler's rows."""
    args = trainer.grpo_args
    size, rank = args.episodes_per_task, trainer.accelerator.process_index
    step = trainer.state.global_step
    mixture, difficulty = trainer.mixture, trainer.difficulty
    envs, indices = None, None
    if mixture is not None:  # the mixture's stratified draw, not TRL's sampler
        envs, tasks = _unzip(mixture.step_picks(step, wanted))
    else:
        indices = [int(row["task_index"]) for row in inputs[::size]][:wanted]
        if difficulty is not None:  # the step's tasks by estimated difficulty
            indices, saved = difficulty.draw(wanted, (args.task_seed, step, rank))
            trainer.record_metrics(difficulty.metrics(saved))
        tasks = [trainer.tasks[i] for i in indices]
    pool = GroupPool(wanted, signal=group_signal(args))
    for attempt in range(args.max_sampling_attempts):
        if attempt > 0:
            # Every process collects in every round (generation may be collective: ZeRO-3,
            # FSDP, vLLM server); one whose batch is already full refills a single group.
            seed = (args.task_seed, step, attempt, rank)
            if mixture is not None:
                envs, tasks = _unzip(mixture.refill_picks(max(1, pool.deficit), seed))
            else:
                indices = refill_tasks(range(len(trainer.tasks)), max(1, pool.deficit), seed)
                tasks = [trainer.tasks[i] for i in indices]
        groups = trainer.collect(
            tasks,
            episodes_per_task=size,
            temperature=args.temperature,
            max_turns=args.max_turns or 1,
            envs=envs,
        )
        for group in groups:
            pool.add(group, trainer.group_rewards(group))
        if difficulty is not None and indices is not None:  # every process learns
            outcomes = gather_object([group_outcomes(indices, groups)])
            difficulty.add([o for part in outcomes for o in part])
        deficit = torch.tensor([pool.deficit], device=trainer.accelerator.device)
        if args.max_sampling_attempts == 1 or trainer.accelerator.gather(deficit).max() == 0:
            break
    return pool
