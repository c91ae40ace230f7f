"""TRL's own GRPOTrainer with our rollout engine inside: a ``rollout_func``.

TRL 1.16 calls ``rollout_func(prompts, trainer)`` in place of its generation: ``prompts`` is the
process's slice of the batch, each dataset row already repeated ``num_generations`` times in a
row, and the answer is one completion per prompt: ``prompt_ids``, ``completion_ids``,
``logprobs``, and any extra per-completion fields. TRL reads ``env_mask`` as its tool mask (1 =
sampled by the model and trained, 0 = tokens from the environment, no loss) and hands every other
extra field to the reward functions as a keyword argument. It works with or without vLLM
(``use_vllm=False`` generates with the trainer's own model).

:func:`rollout_func` builds that callable for any registered llm_gym environment: it plays one
whole episode per prompt with :func:`~llm_gym.rollout.collect_groups` (each row's repeats form
one group), generating with our continuous-batching HF engine on the trainer's model (unwrapped
at every call, so the weights are always the current ones) or, under ``use_vllm=True``, through
TRL's vLLM engine (TRL publishes the weights before each call). The rows come from
:func:`~llm_gym.integrations.trl.trl_dataset`; ``prompts`` alone cannot say which task a row
was (GuessNumber's 1,000 training tasks share 28 openings), so the rollout reads each row
through TRL's ``environment_factory``, whose instances TRL resets with the row:

    from trl import GRPOConfig, GRPOTrainer
    from llm_gym.integrations.trl import rollout_func, rollout_reward, trl_dataset

    rollout = rollout_func("ToolUseGame-v0", max_turns=4, max_new_tokens=64)
    trainer = GRPOTrainer(
        model="path/to/model",
        args=GRPOConfig(num_generations=4, ...),
        train_dataset=trl_dataset("ToolUseGame-v0", "train"),
        rollout_func=rollout,
        environment_factory=rollout.environment_factory,  # hands the rollout each row
        reward_funcs=[rollout_reward],  # the environment's own reward
    )

Each completion is the episode's token sample as our trainer trains it (``TokenSample``): every
assistant turn's sampled ids with the sampler's logprobs, the environment's replies between
them as the chat template renders them. The rules of an episode (turn cap, parse failures,
truncation causes) are the driver's, as everywhere else. An episode cut at ``max_turns`` ends
with the environment's reply, not an end-of-turn token, so TRL counts it as clipped (and
``mask_truncated_completions=True`` masks it, as our trainer's ``overlong_masking`` would).
An episode the environment ended stops at the model's last token (its end of turn), whatever
the environment replied after it (GuessNumber's "Correct!"), so TRL never counts it as
clipped.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from llm_gym.core.env import TruncationCause
from llm_gym.core.registry import as_env_entry
from llm_gym.core.task import Task, task_key
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.trl.environment import TASK_ID
from llm_gym.policies import Policy, policy_from_spec
from llm_gym.policies.chat import render_chat
from llm_gym.policies.template_format import episode_format
from llm_gym.policies.template_tools import check_template_tools
from llm_gym.rollout import DEFAULT_FAILED_PARSE_REWARD, Episode, collect_groups
from llm_gym.rollout.tokens import episode_to_samples

__all__ = [
    "EXTRA_FIELDS",
    "RolloutRow",
    "TRLRollout",
    "rollout_func",
    "rollout_reward",
    "trl_rollout_output",
]

EXTRA_FIELDS = ("env_mask", "episode_reward", "truncation_cause", "episode_turns")
"""The fields the rollout returns besides TRL's three: TRL takes ``env_mask`` as its tool mask;
the others reach reward functions as keyword arguments (one value per completion)."""
VOID_CAUSES = frozenset(cause for cause in TruncationCause if cause.is_void)
"""Endings that are the infrastructure's doing (``TruncationCause.is_void``, as the trainer):
:func:`rollout_reward` gives them no reward, so TRL keeps them out of the group's baseline."""


class RolloutRow:
    """The ``environment_factory`` of a :class:`TRLRollout`: TRL makes one per rollout and
    resets it with the rollout's dataset row, which is how the rollout learns each prompt's
    task. It offers no tools (TRL's own tool loop stays off) and no reward."""

    def __init__(self) -> None:
        self.row: dict[str, Any] = {}
        """The dataset row of the last ``reset``."""

    def reset(self, **row: Any) -> None:
        """Keep the row (the prompt stays as it is)."""
        self.row = row


def rollout_reward(
    completions: Sequence[Any],
    episode_reward: Sequence[float],
    truncation_cause: Sequence[str | None],
    **kwargs: Any,
) -> list[float | None]:
    """A TRL reward function: each completion's reward is its episode's, as the environment
    gave it (``failed_parse_reward`` on a parse failure). An episode the infrastructure cut
    short (a policy error, a missed generation deadline) gets None: TRL leaves it out of its
    group's baseline and gives it no advantage.

    Example:
        >>> rollout_reward(["a", "b"], [1.0, 0.0], [None, "policy_error"])
        [1.0, None]
    """
    rewards: list[float | None] = []
    for _, reward, cause in zip(completions, episode_reward, truncation_cause, strict=True):
        rewards.append(None if cause in VOID_CAUSES else float(reward))
    return rewards


def trl_rollout_output(
    episodes: Sequence[Episode],
    tokenizer: Any,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    template_tools: str = "fallback",
) -> dict[str, Any]:
    """The dict ``rollout_func`` returns for ``episodes`` (one completion each, in order).

    Each episode gives its first token sample (:func:`~llm_gym.rollout.episode_to_samples`);
    an episode whose chat template rewrote history has more than one, and only the first, the
    one that starts at the row's prompt, trains (a warning says so). An episode without a
    sampled token (the policy failed its first turn, the environment's ``reset`` raised) gives
    its rendered opening and one end-of-text token that trains nothing. ``logprobs`` is None
    when a turn came without the sampler's logprobs (a scripted policy).
    """
    template_kwargs = dict(chat_template_kwargs or {})
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    output: dict[str, list[Any]] = {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        **{field: [] for field in EXTRA_FIELDS},
    }
    split = 0
    for episode in episodes:
        samples = episode_to_samples(
            episode,
            tokenizer,
            chat_template_kwargs=template_kwargs,
            template_tools=template_tools,
        )
        split += len(samples) > 1
        if samples:
            sample = samples[0]
            prompt_ids, completion_ids = list(sample.prompt_ids), list(sample.completion_ids)
            env_mask, logprobs = list(sample.env_mask), list(sample.logprobs)
            if episode.truncation_cause is None and len(samples) == 1:
                # Ended by the environment: the completion ends with the model's last token
                # (its end of turn), not the env's closing reply, which TRL would read as clipped.
                end = _last_sampled(env_mask) + 1
                completion_ids, env_mask, logprobs = (
                    completion_ids[:end], env_mask[:end], logprobs[:end],
                )  # fmt: skip
        else:
            opening = episode.messages[: episode.num_opening_messages]
            text = render_chat(
                tokenizer,
                opening,
                episode.tool_specs,
                add_generation_prompt=True,
                chat_template_kwargs=template_kwargs,
                action_format=episode.action_format,
                template_tools=template_tools,
            )
            prompt_ids = list(tokenizer.encode(text, add_special_tokens=False)) or [eos]
            completion_ids, env_mask, logprobs = [eos], [0], [0.0]
        output["prompt_ids"].append(prompt_ids)
        output["completion_ids"].append(completion_ids)
        output["env_mask"].append(env_mask)
        output["logprobs"].append(logprobs)
        output["episode_reward"].append(float(episode.reward))
        cause = episode.truncation_cause
        output["truncation_cause"].append(None if cause is None else str(cause))
        output["episode_turns"].append(episode.num_turns)
    if split:
        warnings.warn(
            f"{split} episode(s) left the chat template's prefix (it rewrote earlier turns): "
            "TRL takes one completion per prompt, so only their turns before that point train. "
            "A prefix-preserving chat template keeps every turn.",
            stacklevel=2,
        )
    if any(t.logprobs is None for e in episodes for t in e.turns):
        return {**output, "logprobs": None}
    return output


def _last_sampled(env_mask: Sequence[int]) -> int:
    """The index of the last token the policy sampled (mask 1), or -1."""
    for index in range(len(env_mask) - 1, -1, -1):
        if env_mask[index]:
            return index
    return -1


class TRLRollout:
    """The ``rollout_func`` of one environment (see the module docstring; built by
    :func:`rollout_func`)."""

    environment_factory = RolloutRow
    """Pass it as ``GRPOTrainer(environment_factory=...)``: each rollout's dataset row."""

    def __init__(
        self,
        env: Any,
        *,
        split: str = "train",
        task_options: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        max_new_tokens: int | None = None,
        max_model_length: int | None = None,
        action_format: str | None = None,
        failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        env_timeout_s: float | None = None,
        policy: Policy | None = None,
        template_tools: str = "fallback",
    ) -> None:
        entry = as_env_entry(env)
        tasks = entry.tasks(split, **dict(task_options or {}))
        self.entry = entry
        self.tasks: dict[str, Task] = {task_key(t, i): t for i, t in enumerate(tasks)}
        """The split's tasks by the key ``trl_dataset`` writes in each row's ``task_id``."""
        self.max_turns = entry.max_turns if max_turns is None else max_turns
        self.max_new_tokens = max_new_tokens
        self.max_model_length = max_model_length
        self.action_format = action_format or entry.requested_action_format
        """The format asked for: ``"auto"`` resolves per call from the trainer's tokenizer."""
        self.failed_parse_reward = failed_parse_reward
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_tools = check_template_tools(template_tools)
        self.env_timeout_s = env_timeout_s
        self.policy = policy
        self.last_episodes: list[Episode] = []
        """The episodes of the last call, in the order of its prompts."""
        for name, value in (("max_turns", self.max_turns), ("max_new_tokens", max_new_tokens)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidArgumentError(f"{name} must be an int >= 1, actual value: {value!r}.")

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """One episode per prompt; TRL's ``rollout_func(prompts, trainer)``."""
        tasks = self.tasks_of(trainer, len(prompts))
        training = bool(getattr(getattr(trainer, "model", None), "training", True))
        size = trainer.num_generations if training else trainer.num_generations_eval
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        grouped = _in_groups(tasks, size)
        fmt = episode_format(
            self.action_format,
            tokenizer,
            env_format=self.entry.action_format,
            template_tools=self.template_tools,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        with self._policy(trainer, tokenizer) as policy:
            groups = collect_groups(
                self.entry.env_factory(),
                tasks[::size] if grouped else tasks,
                policy,
                episodes_per_task=size if grouped else 1,
                max_turns=self.max_turns,
                max_model_length=self.max_model_length,
                max_new_tokens=self.max_new_tokens or trainer.max_completion_length,
                action_format=fmt,
                failed_parse_reward=self.failed_parse_reward,
                oracle=self.entry.oracle(),
                tokenizer=tokenizer,
                chat_template_kwargs=self.chat_template_kwargs,
                template_tools=self.template_tools,
                env_timeout_s=self.env_timeout_s,
            )
        self.last_episodes = [episode for group in groups for episode in group]
        return trl_rollout_output(
            self.last_episodes, tokenizer, self.chat_template_kwargs, self.template_tools
        )

    def tasks_of(self, trainer: Any, count: int) -> list[Task]:
        """The task of each of the ``count`` prompts, from the rows TRL reset its
        environments with."""
        rows = getattr(trainer, "environments", None)
        if not rows or not all(isinstance(r, RolloutRow) for r in rows):
            raise InvalidArgumentError(
                "The rollout needs each prompt's dataset row: pass "
                "environment_factory=rollout.environment_factory to GRPOTrainer along with "
                "rollout_func=rollout."
            )
        if len(rows) != count:
            raise InvalidArgumentError(
                f"Expected one environment per prompt, got {len(rows)} for {count} prompts."
            )
        tasks = []
        for row in rows:
            task_id = row.row.get(TASK_ID)
            if not isinstance(task_id, str) or task_id not in self.tasks:
                raise InvalidArgumentError(
                    f"The row's {TASK_ID!r} ({task_id!r:.80}) names no task of {self.entry.id}'s "
                    "split: build the dataset with llm_gym.integrations.trl.trl_dataset (same "
                    "split and task_options as the rollout)."
                )
            tasks.append(self.tasks[task_id])
        return tasks

    @contextlib.contextmanager
    def _policy(self, trainer: Any, tokenizer: Any) -> Iterator[Policy]:
        """The policy of this call: the given one, TRL's vLLM engine, or our HF engine on the
        trainer's model unwrapped for generation (eval mode, no gradients)."""
        if self.policy is not None:
            yield self.policy
            return
        if getattr(trainer, "use_vllm", False):
            policy = policy_from_spec("vllm", trainer=trainer, temperature=trainer.temperature)
            try:
                yield policy
            finally:
                policy.finish()
            return
        import torch

        with generation_model(trainer) as model, torch.no_grad():
            was_training = model.training
            model.eval()
            policy = policy_from_spec(
                "hf",
                model=model,
                tokenizer=tokenizer,
                temperature=trainer.temperature,
                top_p=trainer.top_p,
                max_new_tokens=self.max_new_tokens or trainer.max_completion_length,
                seed=None,
            )
            try:
                yield policy
            finally:
                policy.finish()
                model.train(was_training)


def _in_groups(tasks: Sequence[Task], size: int) -> bool:
    """Whether ``tasks`` come as TRL's sampler lays them out: runs of ``size`` repeats."""
    if size < 1 or len(tasks) % size:
        return False
    return all(
        all(t is tasks[start] for t in tasks[start : start + size])
        for start in range(0, len(tasks), size)
    )


def rollout_func(
    env: Any,
    *,
    split: str = "train",
    task_options: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    max_new_tokens: int | None = None,
    max_model_length: int | None = None,
    action_format: str | None = None,
    failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    env_timeout_s: float | None = None,
    policy: Policy | None = None,
    template_tools: str = "fallback",
) -> TRLRollout:
    """The ``rollout_func`` of ``GRPOTrainer`` for an llm_gym environment.

    Args:
        env: A registered id (``"ToolUseGame-v0"``), its ``EnvEntry``, or an env factory.
        split: The split whose tasks the dataset's rows name (``trl_dataset``'s split).
        task_options: Options of the task source (``trl_dataset``'s).
        max_turns: Assistant turns before ``MAX_TURNS`` truncation (None: the env's own).
        max_new_tokens: Tokens per assistant turn (None: the trainer's
            ``max_completion_length``, per turn).
        max_model_length: Context budget of an episode in tokens, prompt included (None: none);
            past it the episode ends as ``CONTEXT_OVERFLOW``.
        action_format: How assistant text is parsed and tool calls written: a registered name
            (pinned), or ``"auto"``: the one the trainer's chat template teaches, else the
            env's (:func:`~llm_gym.policies.template_format.episode_format`). None: the env's
            when it pins one, else ``"auto"``.
        failed_parse_reward: Reward of an episode that ends on an unparseable action.
        chat_template_kwargs: Extra chat template arguments.
        env_timeout_s: Seconds an environment's ``reset``/``step`` may take (None: no limit).
        policy: Generate with this policy instead of the trainer's model (a scripted policy in
            tests; its episodes are off-policy for the trainer).
        template_tools: A chat template that cannot render tools: ``"fallback"`` (the tools as
            text, :mod:`llm_gym.policies.template_tools`) or ``"require"`` (refused).

    Returns:
        A :class:`TRLRollout`: pass it as ``rollout_func=`` and its ``environment_factory`` as
        ``environment_factory=``; reward with :func:`rollout_reward`. Sampling follows the
        trainer's ``temperature`` and ``top_p``.
    """
    return TRLRollout(
        env,
        split=split,
        task_options=task_options,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        max_model_length=max_model_length,
        action_format=action_format,
        failed_parse_reward=failed_parse_reward,
        chat_template_kwargs=chat_template_kwargs,
        env_timeout_s=env_timeout_s,
        policy=policy,
        template_tools=template_tools,
    )


@contextlib.contextmanager
def generation_model(trainer: Any) -> Iterator[Any]:
    """TRL's ``unwrap_model_for_generation`` over ``trainer``'s model, with its settings.

    TRL calls the model's ``is_gradient_checkpointing`` and ``gradient_checkpointing_*``, which
    transformers 5 deprecates for their ``activation_checkpointing`` names; those
    FutureWarnings, about TRL's code rather than the user's, are not shown (every other warning
    is).
    """
    from trl.models import unwrap_model_for_generation

    args = trainer.args
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated",
            category=FutureWarning,
        )
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model:
            yield model
