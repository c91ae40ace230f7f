"""Agent episodes in the trainer: the policy served as a training endpoint to the user's agent.

With an agent (``train_multi_turn(agent=...)`` or the config's ``agent: module:function``),
:class:`AgentCollector` replaces the episode loop for every collection, training and
validation alike: it serves the trainer's generation model (the weights of the current step:
the same model object, updated in place between steps) on a loopback
:class:`~llm_gym.serving.openai_server.ChatCompletionServer` whose
:class:`~llm_gym.serving.recording.Recorder` serves only the episodes it opened, and runs the
agent ``episodes_per_task`` times per task (:func:`llm_gym.serving.agent_episodes.
run_agent_groups`). Each call is sampled at the collection's temperature and the config's
``top_p``, at most ``max_tokens_per_turn`` tokens, within ``max_model_length``; an episode
makes ``max_turns`` calls at most and runs ``agent_timeout_s`` seconds at most. The episodes
come back as the loop's records, so group advantages, overlong shaping and masking, dynamic
sampling and ``save_episodes`` apply unchanged.

With ``max_steps_off_policy`` (async training) the training groups run on the generator
replicas instead (:class:`~trainers.async_rl.collect.AsyncCollector`): each replica's copy of
the model is served on a training endpoint of its own with its
:class:`~llm_gym.policies.weights.VersionedWeights` (:meth:`AgentCollector.replica`), and the
rollout worker runs the agent's groups against it (:meth:`AgentCollector.group`). Every call
samples with the replica's newest weights, swapped in before the call starts (a call in flight
finishes under the weights it started with, in every sync mode), and its tokens record that
version, so staleness, the off-policy correction and the ``async/...`` metrics apply as to the
episode loop's groups. Validation stays in lockstep, on the trainer's own model.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from typing import Any

from llm_gym.core.factories import EnvFactory, resolve
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.episode import Episode
from llm_gym.serving.agent_episodes import (
    AgentLoop,
    AgentRun,
    Scorer,
    check_agent,
    run_agent_groups,
)
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig

__all__ = ["AgentCollector", "ServedReplica", "resolve_agent", "training_endpoint"]


def resolve_agent(agent: Any, args: MultiTurnGRPOConfig, mixture: Any = None) -> Any:
    """The agent to train: ``agent`` when given, else the config's ``agent`` reference
    (``"my_pkg.agents:play"``, resolved under :mod:`llm_gym.core.references`' rules), else
    None (the episode loop). An agent plays one environment: refused beside a ``mixture``."""
    where = "agent"
    if agent is None and args.agent is not None:
        agent, where = resolve(args.agent), f"agent {args.agent!r}"
    if agent is None:
        return None
    if mixture is not None:
        raise InvalidArgumentError(
            "an agent plays one environment (env_factory and tasks): train it without envs."
        )
    if args.use_vllm:
        raise InvalidArgumentError(
            "an agent talks to the trainer's own endpoint (the trainer's model, or each async "
            "generator replica's copy), not to vLLM: set use_vllm False."
        )
    return check_agent(agent, where)


def training_endpoint(
    model: Any,
    tokenizer: Any,
    args: MultiTurnGRPOConfig,
    *,
    weights: Any = None,
    temperature: float | None = None,
    max_calls: int | None = None,
) -> Any:
    """``model`` on a loopback :class:`~llm_gym.serving.openai_server.ChatCompletionServer`
    that records, and serves only, the episodes it opens, under the run's limits: at most
    ``max_tokens_per_turn`` tokens a call within ``max_model_length``, the config's ``top_p``,
    ``temperature`` and ``max_calls`` calls an episode (None: set per collection on its
    recorder). ``weights``: the model's versioned weights (an async replica's)."""
    from llm_gym.serving.openai_server import ChatCompletionServer

    return ChatCompletionServer(
        model,
        tokenizer,
        model_name=str(getattr(model, "name_or_path", "") or "policy"),
        default_max_tokens=args.max_tokens_per_turn,
        tool_parser=args.action_format,
        template_tools=args.template_tools,
        record={
            "open_only": True,
            "max_model_length": args.max_model_length,
            "max_tokens": args.max_tokens_per_turn,
            "top_p": args.top_p,
            "temperature": temperature,
            "max_calls": max_calls,
        },
        weights=weights,
    )


class ServedReplica:
    """An async generator replica served as a training endpoint (:meth:`AgentCollector.replica`).

    Args:
        server: The endpoint, serving the replica's model with its versioned weights.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self.started = time.perf_counter()

    @property
    def idle_seconds(self) -> float:
        """Seconds the endpoint's engine had no call to sample, since it started."""
        busy = self.server.recorder.generating_seconds
        return max(0.0, time.perf_counter() - self.started - busy)

    def close(self) -> None:
        """Stop the endpoint (idempotent)."""
        self.server.close()


class AgentCollector:
    """The trainer's training endpoint and its agent (see the module docstring).

    Args:
        agent: ``agent(base_url, task) -> reward | final answer``.
        env_factory: Grades a final answer when no ``scorer`` does.
        args: The run's config.
        tokenizer: The policy's tokenizer.
        scorer: ``scorer(task, answer) -> reward`` (None: the env grades answers).
    """

    def __init__(
        self,
        agent: Any,
        env_factory: EnvFactory,
        args: MultiTurnGRPOConfig,
        tokenizer: Any,
        scorer: Scorer | None = None,
    ) -> None:
        self.agent = agent
        self.env_factory = env_factory
        self.args = args
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.server: Any = None
        self.loop: AgentLoop | None = None
        self._keys = itertools.count()

    def _start(self, model: Any) -> Any:
        self.server = training_endpoint(model, self.tokenizer, self.args)
        return self.server

    def _run(self, server: Any) -> AgentRun:
        return AgentRun(
            self.agent,
            self.env_factory,
            server.engine.action_format,
            timeout_s=self.args.agent_timeout_s,
            scorer=self.scorer,
        )

    def replica(self, model: Any, weights: Any) -> ServedReplica:
        """An async generator replica: ``model`` (the replica's own copy) served with its
        versioned ``weights``, at the config's ``temperature``, ``max_turns`` calls an
        episode."""
        args = self.args
        server = training_endpoint(
            model,
            self.tokenizer,
            args,
            weights=weights,
            temperature=args.temperature,
            max_calls=args.max_turns or 1,
        )
        return ServedReplica(server)

    async def group(self, replica: ServedReplica, task: Task, key: Hashable) -> list[Episode]:
        """The agent's ``episodes_per_task`` episodes of ``task`` against ``replica`` (one
        async group; ``key`` tells the worker's groups apart)."""
        server = replica.server
        groups = await run_agent_groups(
            self._run(server),
            server.recorder,
            server.url.removesuffix("/v1"),
            [task],
            episodes_per_task=self.args.episodes_per_task,
            key=f"a{key}",
        )
        return groups[0]

    def collect(
        self,
        trainer: Any,
        tasks: Sequence[Task],
        episodes_per_task: int,
        temperature: float,
        max_turns: int,
        sequential: bool,
    ) -> list[list[Episode]]:
        """Groups of agent episodes of ``tasks``, sampled from ``trainer``'s generation
        model with the weights of its current step."""
        import torch

        from llm_gym.integrations.trl.rollout import generation_model
        from trainers.grpo.collection import sampling_model
        from trainers.grpo.rollouts import torch_threads

        cpu = trainer.accelerator.device.type == "cpu"
        with (
            generation_model(trainer) as model,
            torch.no_grad(),
            trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
            torch_threads(self.args.generator_threads if cpu else None),
        ):
            training = model.training
            model.eval()
            try:
                sampler = sampling_model(trainer, model)  # its bf16 copy when sampling in bf16
                return self._collect(
                    sampler, tasks, episodes_per_task, temperature, max_turns, sequential
                )
            finally:
                model.train(training)

    def _collect(
        self,
        model: Any,
        tasks: Sequence[Task],
        episodes_per_task: int,
        temperature: float,
        max_turns: int,
        sequential: bool,
    ) -> list[list[Episode]]:
        server = self.server or self._start(model)
        server.engine.model = model  # the generation model of this step
        recorder = server.recorder
        recorder.temperature = temperature
        recorder.max_calls = max_turns
        run = self._run(server)
        base_url = server.url.removesuffix("/v1")
        key = f"c{next(self._keys)}"
        self.loop = self.loop or AgentLoop()
        return self.loop.run(
            run_agent_groups(
                run,
                recorder,
                base_url,
                tasks,
                episodes_per_task=episodes_per_task,
                key=key,
                sequential=sequential,
            )
        )

    def close(self) -> None:
        """Stop the endpoint (idempotent)."""
        if self.loop is not None:
            loop, self.loop = self.loop, None
            loop.close()
        if self.server is not None:
            server, self.server = self.server, None
            server.close()
