"""The trainer's side of async training: generator replicas, their worker, weight publication.

:class:`AsyncCollector` is built by :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer` at its
first rollout batch when ``max_steps_off_policy`` is set (so a resumed run starts from the weights
it loaded). It

- builds ``num_generator_replicas`` generators: a deep copy of the trainer's model (in bf16 when
  the run samples in bf16: :mod:`trainers.grpo.precision`) behind the continuous-batching
  ``HFPolicy`` engine, with :class:`~llm_gym.policies.weights.VersionedWeights`
  (or, with ``use_vllm``, TRL's vLLM engine, whose weights move with ``sync_weights``; or, with
  an agent, the copy served on a training endpoint of its own, whose engine swaps a staged
  version in before each call: :meth:`trainers.grpo.agent_rollouts.AgentCollector.replica`);
- starts a :class:`~trainers.async_rl.rollout.RolloutWorker` that keeps ``groups_in_flight`` groups
  running;
- :meth:`~AsyncCollector.publish` es the trainer's weights after every optimizer step, in the
  configured :class:`~trainers.async_rl.weight_sync.WeightSyncType`;
- :meth:`~AsyncCollector.take` s a batch: groups older than ``max_steps_off_policy`` are dropped
  and counted, groups without a learning signal
  (:func:`trainers.grpo.rejection_sampling.group_signal`) are skipped as dynamic sampling skips
  them in lockstep (``max_sampling_attempts`` x the batch's groups at most), and the async metrics
  are measured.

On CPU the generators and the trainer split the process's torch threads (``generator_threads``
each, the trainer the rest): on a 2-core machine each gets its own core.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch

from llm_gym.core.factories import EnvFactory, Oracle
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import Policy, policy_from_spec
from llm_gym.policies.base import PolicyStream
from llm_gym.policies.vllm import generation_lock
from llm_gym.policies.weights import VersionedWeights
from llm_gym.rollout.episode import Episode
from llm_gym.rollout.loop import collect_groups_async
from trainers.async_rl.rollout import RolloutWorker
from trainers.async_rl.weight_sync import CallbackPublisher, InProcessPublisher, WeightSyncType
from trainers.grpo.agent_rollouts import AgentCollector, ServedReplica
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig
from trainers.grpo.dynamic_sampling import GroupPool
from trainers.grpo.precision import generator_copy
from trainers.grpo.rejection_sampling import group_signal
from trainers.grpo.rollouts import MixturePart

__all__ = ["AsyncBatch", "AsyncCollector"]


class AsyncBatch:
    """One step's groups from the worker, and what taking them measured."""

    def __init__(self) -> None:
        self.pool: GroupPool | None = None
        self.taken = 0
        self.dropped_stale = 0
        self.wait_s = 0.0
        self.ages: list[int] = []


class AsyncCollector:
    """Generators, worker and publisher of one async run (see the module docstring).

    Args:
        trainer: The :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer`.
        env_factory: Builds each episode's environment.
        oracle: The environment's expert (scripted policies only).
        agents: The run's agent (its groups replace the episode loop's; None: the loop).
    """

    def __init__(
        self,
        trainer: Any,
        env_factory: EnvFactory,
        oracle: Oracle | None,
        agents: AgentCollector | None = None,
    ) -> None:
        args: MultiTurnGRPOConfig = trainer.args
        self.args = args
        self.trainer = trainer
        self.mode = WeightSyncType(args.weight_sync_type)
        self.version = int(trainer.state.global_step)
        world = trainer.accelerator.num_processes
        self.batch_size = args.batch_size // world
        self._restore_threads: int | None = None
        self._idle_seen = 0.0
        self._apply_seen = 0.0
        self.agents = agents
        self.served: list[ServedReplica] = []
        self._refuse_unsupported(trainer)
        threads = self._split_threads(trainer)
        try:
            self._start(trainer, env_factory, oracle, threads)
        except BaseException:
            self._close_served()
            self._give_threads_back()
            raise

    def _refuse_unsupported(self, trainer: Any) -> None:
        """What the config cannot see: the model's wrapping and adapters."""
        if getattr(trainer, "is_fsdp_enabled", False) or getattr(
            trainer, "is_deepspeed_enabled", False
        ):
            raise InvalidArgumentError(
                "max_steps_off_policy does not run under FSDP or DeepSpeed: generators copy the "
                "whole model, which those shard; use DDP (accelerate's multi-process default)."
            )
        peft = hasattr(trainer.accelerator.unwrap_model(trainer.model), "peft_config")
        if peft and self.mode is WeightSyncType.PIPELINE:
            raise InvalidArgumentError(
                "weight_sync_type must be SYNCHRONOUS or BACKGROUND_PUBLISH with a PEFT adapter "
                "(peft_config or use_lora): PIPELINE needs full-weight training."
            )
        if peft and trainer.use_vllm and self.mode is not WeightSyncType.SYNCHRONOUS:
            raise InvalidArgumentError(
                "weight_sync_type must be SYNCHRONOUS with use_vllm and a PEFT adapter: TRL's "
                "sync merges the adapter into the trainer's own model while it reads the weights, "
                "which must not overlap a training step."
            )

    def _start(
        self, trainer: Any, env_factory: EnvFactory, oracle: Oracle | None, threads: int | None
    ) -> None:
        args = self.args
        world = trainer.accelerator.num_processes
        rank = trainer.accelerator.process_index
        tokenizer = trainer.episode_tokenizer
        settings = args.rollout_settings(args.max_turns or 1)

        mixture = trainer.mixture

        async def collect(
            policy: Policy, stream: PolicyStream | None, index: int, key: Hashable
        ) -> list[Episode]:
            if mixture is not None:  # the env of the draw's slot, with its own settings
                env, task = mixture.locate(index)
                (part,) = mixture.parts([(env, task)], validation=False)
            else:
                part = MixturePart("", env_factory, [trainer.tasks[index]], settings, oracle)
            groups = await collect_groups_async(
                part.env_factory, part.tasks, policy, part.settings,
                episodes_per_task=args.episodes_per_task, oracle=part.oracle or oracle,
                tokenizer=tokenizer, stream=stream, key_space=key,
            )  # fmt: skip
            for episode in groups[0]:
                episode.env_id = part.name or None
            return groups[0]

        agents = self.agents

        async def agent_group(
            replica: Any, stream: PolicyStream | None, index: int, key: Hashable
        ) -> list[Episode]:
            assert agents is not None
            return await agents.group(replica, trainer.tasks[index], key)

        if trainer.use_vllm:
            publisher = CallbackPublisher(
                trainer.vllm_generation.sync_weights,
                self.mode,
                version=self.version,
                lock=generation_lock(trainer.vllm_generation),
            )
            vllm = policy_from_spec(
                "vllm",
                trainer=trainer,
                temperature=args.temperature,
                version=lambda: publisher.version,  # read under the lock the sync holds
            )
            if getattr(vllm, "collective", False):
                raise InvalidArgumentError(
                    "max_steps_off_policy with use_vllm runs on one process (or colocate without "
                    "tensor parallelism): vLLM then generates collectively across processes, "
                    "which a rollout thread cannot do beside the trainer's own collectives "
                    f"(got {world} processes, vLLM mode {trainer.vllm_generation.mode!r})."
                )
            publisher.publish(self.version)  # a resumed run's server holds the initial weights
            publisher.join()
            self.publisher: InProcessPublisher | CallbackPublisher = publisher
            policies: list[Any] = [vllm]  # Policy, or ServedReplica with an agent
            self.replicas: list[VersionedWeights] = []

            def versions(replica: int) -> int:
                return publisher.latest

        else:
            source = trainer.accelerator.unwrap_model(trainer.model)
            self.replicas = []
            policies = []
            for replica in range(args.num_generator_replicas):
                model = generator_copy(source, bf16=trainer.precision.sampling_bf16)
                weights = VersionedWeights(model, version=self.version, swap=self.mode.swap)
                self.replicas.append(weights)
                seed = args.seed + 7919 * (rank * args.num_generator_replicas + replica + 1)
                if agents is not None:  # served: the agent's calls are its turns
                    self.served.append(agents.replica(model, weights))
                    policies.append(self.served[-1])
                else:
                    policies.append(self._in_process_policy(model, tokenizer, weights, seed))
            self.publisher = InProcessPublisher(
                source, self.replicas, self.mode, check=lambda: self.worker.check()
            )

            def versions(replica: int) -> int:
                return self.replicas[replica].latest

        self.worker = RolloutWorker(
            policies,
            collect if agents is None else agent_group,
            trainer.tasks,
            versions=versions,
            groups_in_flight=max(1, args.resolved_groups_in_flight // world),
            batch_size=self.batch_size,
            max_steps_off_policy=args.max_steps_off_policy or 0,
            seed=(args.task_seed, self.version),
            rank=rank,
            world=world,
            threads=threads,
            order=mixture.async_order() if mixture is not None else None,
        )
        self.worker.start()

    def _in_process_policy(
        self, model: Any, tokenizer: Any, weights: VersionedWeights, seed: int
    ) -> Policy:
        args = self.args
        try:
            return policy_from_spec(
                args.rollout_backend,
                model=model,
                tokenizer=tokenizer,
                temperature=args.temperature,
                top_p=args.top_p,
                max_new_tokens=args.max_tokens_per_turn,
                seed=seed,  # its own sampling generator: the trainer's RNG stays untouched
                weights=weights,
            )
        except TypeError as exc:
            raise InvalidArgumentError(
                f"generation_backend {args.rollout_backend!r} cannot run async training: its "
                f"constructor must take weights= (llm_gym.policies.weights.VersionedWeights), "
                f"as HFPolicy does ({exc})."
            ) from exc

    def _split_threads(self, trainer: Any) -> int | None:
        if trainer.accelerator.device.type != "cpu":
            return None
        total = torch.get_num_threads()
        replicas = 1 if trainer.use_vllm else self.args.num_generator_replicas
        generator = self.args.generator_threads or max(1, total // 2)
        self._restore_threads = total
        torch.set_num_threads(max(1, total - generator * replicas))
        return generator

    # --- every step ---------------------------------------------------------------------------

    def publish(self, version: int) -> float:
        """Send the trainer's weights as ``version`` (once per version); trainer seconds."""
        if version <= self.version:
            return 0.0
        seconds = self.publisher.publish(version)
        self.version = version
        self.worker.new_version()
        return seconds

    def take(self, wanted: int, rewards: Callable[[list[Episode]], list[float]]) -> AsyncBatch:
        """``wanted`` groups for the step at the current version (see the module docstring)."""
        args = self.args
        limit = args.max_steps_off_policy or 0
        out = AsyncBatch()
        pool = GroupPool(wanted, signal=group_signal(self.args))
        budget = wanted * args.max_sampling_attempts
        usable = 0
        while True:
            need = wanted - usable if usable < wanted else min(pool.deficit, budget - usable)
            if need <= 0:
                break
            groups, waited = self.worker.take(need)
            out.wait_s += waited
            for start_version, episodes in groups:
                out.taken += 1
                age = self.version - start_version
                if age > limit:
                    out.dropped_stale += 1
                    continue
                out.ages.append(age)
                usable += 1
                pool.add(episodes, rewards(episodes))
        out.pool = pool
        return out

    def metrics(self, taken: Any, publish_s: float, accelerator: Any) -> dict[str, float]:
        """The step's ``async/...`` metrics of ``taken`` (what :meth:`take` returned), the
        publish time since the last step's and the generators' own, gathered over processes."""
        idle_s, apply_s = self.generator_seconds()
        ages = taken.ages or [0]
        local = [
            taken.wait_s,
            float(taken.dropped_stale),
            float(taken.taken),
            float(sum(taken.ages)),
            float(len(taken.ages)),
            float(max(ages)),
            idle_s,
            apply_s,
            publish_s,
        ]
        device = accelerator.device
        rows = accelerator.gather(torch.tensor([local], device=device, dtype=torch.float64))
        wait, dropped, total, age_sum, age_n, age_max, idle, apply, publish = rows.T.tolist()
        return {
            "async/train_wait_s": max(wait),
            "async/dropped_stale_groups": sum(dropped),
            "async/dropped_stale_ratio": sum(dropped) / max(1.0, sum(total)),
            "async/staleness_mean": sum(age_sum) / max(1.0, sum(age_n)),
            "async/staleness_max": max(age_max),
            "async/generator_idle_s": sum(idle),
            "async/weight_apply_s": sum(apply),
            "async/weight_sync_s": max(publish),
        }

    def generator_seconds(self) -> tuple[float, float]:
        """Generator idle and weight-apply seconds since the last call (summed over replicas)."""
        idle = self.worker.idle_seconds()
        applied = sum(w.apply_seconds for w in self.replicas)
        delta = (idle - self._idle_seen, applied - self._apply_seen)
        self._idle_seen, self._apply_seen = idle, applied
        return delta

    def join(self) -> None:
        """Before an optimizer step: a background publication must be done reading weights."""
        self.publisher.join()

    def close(self) -> None:
        """Stop the worker (groups in flight are discarded) and give the threads back. A
        failed background publication is reported as a warning here: ``close`` runs while
        training ends, maybe on another error that must not be masked."""
        try:
            self.worker.stop()
            try:
                self.publisher.join()
            except RuntimeError as exc:
                warnings.warn(str(exc), stacklevel=2)
        finally:
            self._close_served()
            self._give_threads_back()

    def _close_served(self) -> None:
        for replica in self.served:
            replica.close()

    def _give_threads_back(self) -> None:
        if self._restore_threads is not None:
            torch.set_num_threads(self._restore_threads)
            self._restore_threads = None
