"""``MultiTurnGRPOConfig``: TRL's ``GRPOConfig`` plus the seeds' multi-turn fields.

The seeds' call is accepted as written::

    GRPOConfig(model="Qwen/...", batch_size=4, episodes_per_task=8, num_steps=200,
               validation_interval=10, max_turns=6, max_model_length=2048, learning_rate=2e-5,
               wandb_project="grpo-tool-use-game", sequential_validation=True,
               max_sampling_attempts=2)

and mapped onto TRL's batch arithmetic: one optimizer step per rollout batch of
``batch_size * episodes_per_task`` episodes (``num_generations = episodes_per_task``,
``gradient_accumulation_steps = steps_per_generation``, ``max_steps = num_steps``). Inconsistent
settings are refused here, before any model loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig as _TRLGRPOConfig

from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD
from llm_gym.rollout.settings import RolloutSettings
from trainers.async_rl.weight_sync import WeightSyncType
from trainers.distillation.config import DistillationConfig
from trainers.grpo.config.agent import AgentFields
from trainers.grpo.config.checks import check_config
from trainers.grpo.config.dtype import DtypeFields, gpu_support, static_precision
from trainers.grpo.config.field_types import check_field_types
from trainers.grpo.config.keep_best import KeepBestFields
from trainers.grpo.config.scoring import ScoringFields
from trainers.wandb_setup import DEFAULT_PROJECT, check_wandb_setup, report_to_with_wandb

__all__ = ["MultiTurnGRPOConfig"]


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class MultiTurnGRPOConfig(_TRLGRPOConfig, AgentFields, KeepBestFields, DtypeFields, ScoringFields):
    """TRL's ``GRPOConfig`` with the multi-turn fields of the post-training cookbook."""

    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Rows per micro-batch (None: all rows of a step in one micro-batch). Must "
            "divide batch_size x episodes_per_task / processes x max_samples_per_episode."
        },
    )
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in backward to save memory (None: off, or what the "
            "deprecated alias gradient_checkpointing says)."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Transformers' deprecated alias of activation_checkpointing."},
    )
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 autocast in training (None: as dtype decides)."}
    )
    model: str | None = field(
        default=None,
        metadata={
            "help": "The policy: a local model folder, a .gguf file, a packaged model's name "
            "(smollm2-135m-instruct, fetched on first use) or a hub id."
        },
    )
    max_turns: int | None = field(
        default=None,
        metadata={"help": "Assistant turns per episode. Required by train_multi_turn."},
    )
    episodes_per_task: int = field(
        default=1,
        metadata={
            "help": "Episodes per task per step, the group GRPO compares. Set it to 2 or more: "
            "a group of one has no baseline, so GRPO never trains on it (accepted with a "
            "warning; the natural setting for on-policy distillation)."
        },
    )
    batch_size: int = field(default=4, metadata={"help": "Tasks per optimizer step."})
    num_steps: int = field(default=100, metadata={"help": "Optimizer steps (TRL's max_steps)."})
    failed_parse_reward: float = field(
        default=DEFAULT_FAILED_PARSE_REWARD,
        metadata={"help": "Reward of an episode whose last action could not be parsed."},
    )
    val_max_turns: int | None = field(
        default=None, metadata={"help": "Turn limit during validation (None: max_turns)."}
    )
    validation_interval: int | None = field(
        default=None,
        metadata={"help": "Validate every N steps (and before the first and after the last)."},
    )
    sequential_validation: bool = field(
        default=False, metadata={"help": "Run validation episodes one at a time."}
    )
    val_temperature: float = field(
        default=0.0, metadata={"help": "Sampling temperature of validation (0: greedy)."}
    )
    max_sampling_attempts: int = field(
        default=1,
        metadata={
            "help": "Dynamic sampling: groups without a learning signal (GRPO: every episode "
            "got the same reward; rejection_sampling: no episode succeeded) are skipped; up to "
            "this many collection rounds refill the batch."
        },
    )
    overlong_masking: bool = field(
        default=False,
        metadata={
            "help": "Truncated episodes (any cause) build no training tokens; their rewards "
            "still count in the group baseline."
        },
    )
    overlong_buffer: int | None = field(
        default=None,
        metadata={
            "help": "Soft overlong penalty buffer in tokens (None: off). Applies to "
            "CONTEXT_OVERFLOW (linear ramp over the last `overlong_buffer` tokens of "
            "max_model_length) and MAX_TURNS (the full factor)."
        },
    )
    overlong_penalty_factor: float = field(
        default=1.0, metadata={"help": "Size of the soft overlong penalty at its maximum."}
    )
    credit_assignment: str = field(
        default="per_episode",
        metadata={
            "help": "per_episode (the episode's advantage on every turn), per_turn, or "
            "rejection_sampling (RFT: 1 for an episode its environment judged a success, "
            "else 0)."
        },
    )
    max_model_length: int = field(
        default=2048, metadata={"help": "Context budget of an episode in tokens."}
    )
    max_tokens_per_turn: int = field(
        default=256, metadata={"help": "Generation budget of one assistant turn in tokens."}
    )
    max_samples_per_episode: int | None = field(
        default=None,
        metadata={
            "help": "Training rows per episode. An episode splits into several samples only "
            "when the chat template rewrites history (thinking models); each carries the "
            "episode's advantage. None: train on all of them (micro-batches then hold "
            "per_device_train_batch_size x samples-per-episode rows); an int caps them, extra "
            "samples are dropped (counted)."
        },
    )
    distillation: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "On-policy distillation: {'teacher': PATH_OR_HUB_ID or {'base_url': URL, "
            "'model': NAME}, 'kl_coef': 1.0, 'reward_weight': 0.0}. The teacher scores the "
            "student's own samples; the per-token reverse KL on policy tokens is the learning "
            "signal (trainers.DistillationConfig). None: GRPO only."
        },
    )
    judge: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "A judge endpoint's rubric score added to every episode's reward, times its "
            "weight: {'base_url': URL, 'model': NAME, 'rubric': [{'name', 'question', 'kind': "
            "yes_no | scale, 'weight'}], 'mode': episode | group, 'weight': 1.0, 'fallback': "
            "None, ...} (llm_gym.judge.JudgeSettings). A failed judgement adds the fallback "
            "(None: nothing) and is counted (judge/failures). None: no judge."
        },
    )
    difficulty_sampling: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "Online difficulty filtering (lockstep only): draw the tasks whose estimated "
            "pass rate is neither 0 nor 1 more often, every task at least at a floor: {'floor': "
            "0.05, 'prior': 0.0, 'memory': 0.5} ({}: these; trainers.grpo.difficulty). None: TRL's "
            "uniform order."
        },
    )
    report_to: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Where to log (transformers' report_to). None: W&B when wandb_project is "
            "set, else nowhere; 'none' or a list without wandb turns W&B off."
        },
    )
    wandb_project: str | None = field(
        default=DEFAULT_PROJECT,
        metadata={
            "help": "W&B project the run logs to, as the cookbook does by default. Needs a W&B "
            "set-up, checked before any model loads: export WANDB_API_KEY, set "
            "WANDB_MODE=offline to log locally, or pass None to turn logging off (so do "
            "report_to='none' and WANDB_MODE=disabled)."
        },
    )
    action_format: str = field(
        default="auto",
        metadata={
            "help": "How tool calls are written and parsed: auto (the format the model's chat "
            "template teaches: llama3_json, mistral, qwen3_coder, harmony, hermes; hermes for a "
            "template that teaches none) or a registered action format, pinned (a warning when "
            "the template teaches another; an error under template_tools=require)."
        },
    )
    template_tools: str = field(
        default="fallback",
        metadata={
            "help": "A chat template that cannot render tools: fallback (the tools and the "
            "action format's calling convention as text) or require (refused before training)."
        },
    )
    generation_backend: str | None = field(
        default=None,
        metadata={
            "help": "The policy backend that generates episodes: a model backend of "
            "llm_gym.policies' registry. None: vllm when use_vllm, else hf. vllm gets the "
            "trainer (trainer=, temperature=); any other is built in process with model=, "
            "tokenizer=, temperature=, top_p=, max_new_tokens=, seed= and max_batch_size=."
        },
    )
    use_lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter (PEFT)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "LoRA target modules (None: all linear layers)."}
    )
    max_steps_off_policy: int | None = field(
        default=None,
        metadata={
            "help": "Async collection. None: lockstep. An int turns on continuous rollout "
            "workers and bounds a group's age in optimizer steps since its rollout started "
            "(older groups are dropped as stale); 0 admits only groups started under the "
            "current policy. Start with 1."
        },
    )
    groups_in_flight: int | None = field(
        default=None,
        metadata={"help": "Async: rollout groups collected concurrently (None: batch_size)."},
    )
    weight_sync_type: str = field(
        default=WeightSyncType.SYNCHRONOUS.value,
        metadata={
            "help": "How new weights reach the generators after each step: "
            "WEIGHT_SYNC_TYPE_SYNCHRONOUS (inline), WEIGHT_SYNC_TYPE_BACKGROUND_PUBLISH "
            "(deferred; turns in flight finish under the old weights) or "
            "WEIGHT_SYNC_TYPE_PIPELINE (deferred; turns in flight continue under the new "
            "weights). The deferred modes need max_steps_off_policy; PIPELINE needs "
            "use_lora=False."
        },
    )
    num_generator_replicas: int = field(
        default=1,
        metadata={
            "help": "Async: generator copies of the policy, each with its own engine (and "
            "thread). Lockstep generates with the trainer's own model: 1."
        },
    )
    vllm_importance_sampling_mode: str = field(
        default="token_truncate",
        metadata={
            "help": "How the sampler's logprobs are corrected towards the trainer's: vLLM's "
            "(TRL's correction) and, in async runs, tokens older weights sampled. "
            "token_truncate (default here: truncated importance sampling, min(ratio, "
            "vllm_importance_sampling_clip_max)), token_mask, sequence_truncate, sequence_mask."
        },
    )
    generator_threads: int | None = field(
        default=None,
        metadata={
            "help": "Torch threads that generate on CPU. Async: each generator replica's "
            "(None: half the process's threads, at least 1; the trainer keeps the rest). "
            "Lockstep: while collecting (None: the process's threads)."
        },
    )
    generation_deadline_min_s: float | None = field(
        default=600.0,
        metadata={
            "help": "Generation deadline of one turn for an empty context, in seconds; it grows "
            "linearly to generation_deadline_max_s at max_model_length (document 002: 10 to 60 "
            "minutes). A missed deadline aborts the turn and retries it once; a second miss ends "
            "the episode as DEADLINE (episodes/deadline_ratio). None: no deadline."
        },
    )
    env_timeout_s: float | None = field(
        default=None,
        metadata={
            "help": "Seconds an environment's reset/step may take before its episode ends as "
            "ENV (a hung service holds only its own episode). None: no limit (document 002)."
        },
    )
    generation_deadline_max_s: float = field(
        default=3600.0, metadata={"help": "Generation deadline at max_model_length, seconds."}
    )
    task_seed: int = field(
        default=0, metadata={"help": "Seed of the task order and of dynamic-sampling refills."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "The chat template for a model without one (a base model): a named "
            "template (chatml, gemma; its turn tokens added where missing, the embeddings "
            "resized) or a .jinja file. None: the model's own; a model with none is refused."
        },
    )
    save_episodes: str | None = field(
        default=None,
        metadata={"help": "A folder: each step's episodes as JSONL (step-000001.jsonl, ...)."},
    )
    health_action: str = field(
        default="warn",
        metadata={
            "help": "A health check that fires (trainers.grpo.health): warn (a health/<check> "
            "metric, one warning), stop (also end the run after the step, with a checkpoint) "
            "or off."
        },
    )

    def __post_init__(self) -> None:
        try:
            check_config(self)
        except TypeError:  # a check compared a value of the wrong type: name its field
            check_field_types(self)
            raise
        world = _world_size()
        episodes = self.batch_size * self.episodes_per_task
        if self.batch_size % world:
            raise InvalidArgumentError(
                f"batch_size ({self.batch_size}) must be divisible by the number of processes "
                f"({world}) so that each process runs whole groups."
            )
        per_rank_rows = episodes // world * (self.max_samples_per_episode or 1)
        if self.per_device_train_batch_size is None:
            self.per_device_train_batch_size = per_rank_rows
        if self.per_device_train_batch_size < 1 or per_rank_rows % self.per_device_train_batch_size:
            raise InvalidArgumentError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must divide the "
                f"rows each process trains on per step: batch_size x episodes_per_task / "
                f"processes x (max_samples_per_episode or 1) = {per_rank_rows}."
            )
        # One optimizer step per rollout batch: TRL's generation batch is our episodes.
        self.num_generations = group_size = self.episodes_per_task
        if group_size == 1:
            # TRL's GRPOConfig refuses groups of one (its advantage needs a group); ours take one
            # episode per task. Pass its check with a stand-in that divides the generation
            # batch, then restore the real group size (RepeatSampler repeats each task once).
            rows = per_rank_rows * world
            self.num_generations = next((d for d in range(2, rows + 1) if rows % d == 0), 0)
            if not self.num_generations:
                raise InvalidArgumentError(
                    "batch_size x episodes_per_task x processes must be at least 2 (TRL's "
                    f"trainer needs two rows a step), actual value: {rows}."
                )
        self.generation_batch_size = None
        steps = per_rank_rows // self.per_device_train_batch_size
        self.steps_per_generation = self.gradient_accumulation_steps = steps
        self.max_steps = self.num_steps
        self.max_completion_length = self.max_model_length
        gpu, gpu_bf16 = gpu_support()
        precision = static_precision(self, gpu and not self.use_cpu, gpu_bf16)
        self.bf16 = precision is not None and precision.training_bf16  # False: until probed
        self.report_to, wandb = report_to_with_wandb(self.report_to, self.wandb_project, os.environ)
        if wandb:  # before any model loads: a run without a W&B set-up stops here
            check_wandb_setup(self.wandb_project or os.environ.get("WANDB_PROJECT", "huggingface"))
            if self.wandb_project is not None:
                os.environ.setdefault("WANDB_PROJECT", self.wandb_project)
        super().__post_init__()
        self.num_generations = group_size
        self.precision = precision  # None: the trainer probes (trainers.grpo.precision)

    @property
    def is_async(self) -> bool:
        """Continuous rollout workers (``max_steps_off_policy`` set) instead of lockstep."""
        return self.max_steps_off_policy is not None

    @property
    def resolved_groups_in_flight(self) -> int:
        """``groups_in_flight``, None resolved to ``batch_size``."""
        return self.groups_in_flight or self.batch_size

    def rollout_settings(self, max_turns: int, action_format: str | None = None) -> RolloutSettings:
        """How a collection with ``max_turns`` turns per episode runs its episodes (the chat
        template's ``chat_template_kwargs``, ``enable_thinking`` for example, included), in
        ``action_format`` (None: the config's)."""
        return RolloutSettings(
            action_format=action_format or self.action_format,
            max_turns=max_turns,
            max_model_length=self.max_model_length,
            max_new_tokens=self.max_tokens_per_turn,
            failed_parse_reward=self.failed_parse_reward,
            chat_template_kwargs=dict(self.chat_template_kwargs or {}) or None,
            template_tools=self.template_tools,
            generation_deadline_s=None
            if self.generation_deadline_min_s is None
            else (float(self.generation_deadline_min_s), float(self.generation_deadline_max_s)),
            env_timeout_s=self.env_timeout_s,
        )

    def lora_config(self) -> Any:
        """PEFT's ``LoraConfig`` from the ``lora_*`` fields when ``use_lora``, else None."""
        if not self.use_lora:
            return None
        from peft import LoraConfig

        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, task_type="CAUSAL_LM",
                          target_modules=self.lora_target_modules or "all-linear")  # fmt: skip

    @property
    def rollout_backend(self) -> str:
        """The policy kind that generates episodes (``generation_backend`` resolved)."""
        return self.generation_backend or ("vllm" if self.use_vllm else "hf")

    @property
    def distillation_settings(self) -> DistillationConfig | None:
        """``distillation`` as a :class:`~trainers.distillation.config.DistillationConfig`."""
        return None if self.distillation is None else DistillationConfig(**self.distillation)

    @property
    def episodes_per_step(self) -> int:
        """Episodes collected for each optimizer step."""
        return self.batch_size * self.episodes_per_task

    @property
    def validation_max_turns(self) -> int | None:
        """The turn limit of validation episodes."""
        return self.val_max_turns or self.max_turns
