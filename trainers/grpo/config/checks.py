"""Checks of :class:`~trainers.grpo.config.multi_turn.MultiTurnGRPOConfig`'s fields
(:func:`check_config` runs them all): counts, backend, async, deadline, distillation, sampling,
chat-template and reward fields.

Each refuses a value with the field named and what is allowed (``refuse(name, value, allowed)``),
before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from llm_gym.actions import ACTION_FORMATS
from llm_gym.policies.registry import registered_policies
from trainers.async_rl.weight_sync import WeightSyncType
from trainers.distillation.config import DistillationConfig
from trainers.grpo.advantages import ADVANTAGE_ESTIMATORS
from trainers.grpo.config.agent import check_agent_fields
from trainers.grpo.config.dtype import check_dtype
from trainers.grpo.config.keep_best import check_keep_best

__all__ = [
    "check_async",
    "check_config",
    "check_counts",
    "check_backend",
    "check_templates",
    "check_deadline",
    "check_distillation",
    "check_outputs",
    "check_rewards",
    "check_health",
    "check_sampling",
]


def check_async(config: Any, refuse: Any) -> None:
    """The async fields (``max_steps_off_policy``, ``groups_in_flight``, ``weight_sync_type``,
    ``num_generator_replicas``, ``generator_threads``) and what they exclude."""
    off = config.max_steps_off_policy
    if off is not None and (isinstance(off, bool) or not isinstance(off, int) or off < 0):
        refuse("max_steps_off_policy", off, "None (lockstep) or an int >= 0")
    flight = config.groups_in_flight
    if flight is not None and (
        isinstance(flight, bool) or not isinstance(flight, int) or flight < 1
    ):
        refuse("groups_in_flight", flight, "None (batch_size) or an int >= 1")
    if flight is not None and off is None:
        refuse("groups_in_flight", flight, "None in lockstep (set max_steps_off_policy)")
    try:
        mode = WeightSyncType(config.weight_sync_type)
    except ValueError:
        refuse(
            "weight_sync_type",
            config.weight_sync_type,
            f"one of {[m.value for m in WeightSyncType]}",
        )
    config.weight_sync_type = mode.value
    if mode is not WeightSyncType.SYNCHRONOUS and off is None:
        refuse(
            "weight_sync_type",
            mode.value,
            "WEIGHT_SYNC_TYPE_SYNCHRONOUS in lockstep: the deferred modes need "
            "max_steps_off_policy, which bounds and measures the drift they allow",
        )
    if mode is WeightSyncType.PIPELINE and config.use_lora:
        refuse(
            "weight_sync_type",
            mode.value,
            "SYNCHRONOUS or BACKGROUND_PUBLISH with use_lora=True: PIPELINE needs "
            "full-weight training",
        )
    if off is not None and config.num_iterations != 1:
        refuse(
            "num_iterations",
            config.num_iterations,
            "1 with max_steps_off_policy (the staleness bound counts optimizer steps, one "
            "per rollout batch)",
        )
    if off is not None and config.loss_type == "vespo":
        refuse(
            "loss_type",
            config.loss_type,
            "not 'vespo' with max_steps_off_policy: its sequence weight takes the "
            "importance ratio non-linearly, so the off-policy correction cannot weigh the "
            "advantages",
        )
    replicas = config.num_generator_replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        refuse("num_generator_replicas", replicas, "an int >= 1")
    if replicas > 1 and (off is None or config.use_vllm):
        refuse(
            "num_generator_replicas",
            replicas,
            "1 in lockstep (the trainer's own model generates) and with vLLM (TRL's "
            "server has its own data parallelism)",
        )
    threads = config.generator_threads
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        refuse("generator_threads", threads, "None or an int >= 1")


def check_backend(config: Any, refuse: Any) -> None:
    """``generation_backend``: None or a registered model backend, ``"vllm"`` exactly when
    ``use_vllm``."""
    backend = config.generation_backend
    backends = [b.kind for b in registered_policies() if not b.scripted]
    if backend is not None and backend not in backends:
        refuse("generation_backend", backend, f"None or a model backend, one of {backends}")
    if backend and (backend == "vllm") != config.use_vllm:
        refuse(
            "generation_backend",
            backend,
            "'vllm' exactly when use_vllm=True (TRL sets up and syncs the vLLM engine)",
        )


def check_health(config: Any, refuse: Any) -> None:
    """``health_action``: one of :data:`trainers.grpo.health.HEALTH_ACTIONS`."""
    from trainers.grpo.health import HEALTH_ACTIONS

    if config.health_action not in HEALTH_ACTIONS:
        refuse("health_action", config.health_action, f"one of {list(HEALTH_ACTIONS)}")


def check_sampling(config: Any, refuse: Any) -> None:
    """TRL's ``temperature`` (>= 0) and ``top_p`` (in (0, 1]), ``val_temperature`` (>= 0),
    ``learning_rate`` (>= 0) and ``seed`` (numpy's range, where ``transformers.set_seed`` puts
    it): TRL takes any number and fails, or trains backwards, only once training runs. Their
    types are checked before (:func:`~trainers.grpo.config.field_types.check_field_types`)."""
    if not 0 <= config.seed < 2**32:
        refuse("seed", config.seed, f"an integer in [0, {2**32 - 1}]")
    if not 0 <= config.temperature < math.inf:
        refuse("temperature", config.temperature, "a finite number >= 0 (0: greedy)")
    if not 0 < config.top_p <= 1:
        refuse("top_p", config.top_p, "a number in (0, 1]")
    if config.val_temperature < 0:
        refuse("val_temperature", config.val_temperature, ">= 0")
    if not 0 <= config.learning_rate < math.inf:
        refuse("learning_rate", config.learning_rate, "a finite number >= 0")


def check_deadline(config: Any, refuse: Any) -> None:
    """``generation_deadline_min_s`` / ``_max_s``: None turns deadlines off; else
    ``0 < min <= max``. ``env_timeout_s``: None or > 0."""
    timeout = config.env_timeout_s
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        refuse("env_timeout_s", timeout, "None (no limit) or a number of seconds > 0")
    low, high = config.generation_deadline_min_s, config.generation_deadline_max_s
    if low is None:
        return
    if isinstance(low, bool) or not isinstance(low, int | float) or not low > 0:
        refuse("generation_deadline_min_s", low, "None (no deadline) or a number of seconds > 0")
    if isinstance(high, bool) or not isinstance(high, int | float) or not high >= low:
        refuse("generation_deadline_max_s", high, f"a number of seconds >= the minimum ({low})")


def check_distillation(value: Any, refuse: Any) -> dict[str, Any] | None:
    """``distillation`` (None, a mapping or a :class:`DistillationConfig`) as a plain dict with
    every key, checked; the teacher is not loaded here."""
    if value is None:
        return None
    if isinstance(value, DistillationConfig):
        value = dataclasses.asdict(value)
    names = [f.name for f in dataclasses.fields(DistillationConfig)]
    if not isinstance(value, Mapping):
        refuse("distillation", value, f"None or a mapping with keys {names}")
    unknown = sorted(set(value) - set(names))
    if unknown:
        refuse(
            "distillation", dict(value), f"a mapping with keys among {names} (unknown: {unknown})"
        )
    settings = {f.name: f.default for f in dataclasses.fields(DistillationConfig)}
    settings.update(value)
    teacher = settings["teacher"]
    if not (isinstance(teacher, str) and teacher.strip()) and not isinstance(teacher, Mapping):
        refuse(
            "distillation.teacher",
            teacher,
            "a model path or hub id, or {'base_url': URL, 'model': NAME} for an "
            "OpenAI-compatible server that returns prompt logprobs",
        )
    for name, low in (("kl_coef", 0.0), ("reward_weight", 0.0)):
        number = settings[name]
        if (
            isinstance(number, bool)
            or not isinstance(number, int | float)
            or not (math.isfinite(number) and number >= low)
        ):
            refuse(f"distillation.{name}", number, f"a finite number >= {low}")
    if settings["kl_coef"] == 0 and settings["reward_weight"] == 0:
        refuse("distillation.kl_coef", 0, "> 0, or reward_weight > 0 (else nothing trains)")
    size = settings["teacher_batch_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        refuse("distillation.teacher_batch_size", size, "an int >= 1")
    if isinstance(teacher, Mapping):
        from trainers.distillation.teacher import ENDPOINT_TEACHER_KEYS, LOCAL_TEACHER_KEYS

        allowed = ENDPOINT_TEACHER_KEYS if "base_url" in teacher else LOCAL_TEACHER_KEYS
        if not teacher.get("model") or set(teacher) - set(allowed):
            refuse(
                "distillation.teacher",
                dict(teacher),
                f"a mapping with 'model' and keys among {list(allowed)}",
            )
    settings["teacher"] = teacher if isinstance(teacher, str) else dict(teacher)
    return settings


def check_templates(config: Any, refuse: Any) -> None:
    """``chat_template_kwargs``: None, a dict, or a JSON object (TRL's CLI passes one), parsed
    in place; ``template_tools`` one of its modes; ``chat_template`` a known name or file (a
    misspelt name refused here, before any model loads)."""
    from llm_gym.policies.chat_templates import resolve_chat_template
    from llm_gym.policies.template_tools import TEMPLATE_TOOLS_MODES

    if config.template_tools not in TEMPLATE_TOOLS_MODES:
        refuse("template_tools", config.template_tools, f"one of {list(TEMPLATE_TOOLS_MODES)}")
    if config.chat_template is not None:
        resolve_chat_template(config.chat_template)
    value = config.chat_template_kwargs
    if isinstance(value, str):
        try:
            config.chat_template_kwargs = value = json.loads(value)
        except json.JSONDecodeError:
            refuse("chat_template_kwargs", value, "a dict or a JSON object")
    if value is not None and not isinstance(value, dict):
        refuse("chat_template_kwargs", value, "None, a dict or a JSON object")


def check_outputs(config: Any, refuse: Any) -> None:
    """``save_episodes``: None, or a folder's path (missing folders are made at the first
    step); an existing file is refused before any model loads."""
    folder = config.save_episodes
    if folder is not None and (not isinstance(folder, str | os.PathLike) or os.path.isfile(folder)):
        refuse("save_episodes", folder, "None or a folder's path (each step writes a file there)")
    if folder is not None:
        config.save_episodes = os.fspath(folder)


def check_counts(config: Any, refuse: Any) -> None:
    """The counts and budgets of a run: tasks per step, steps, turns, lengths, the advantage
    estimator and the action format; a group of one without distillation is a warning."""
    if config.episodes_per_task == 1 and config.distillation is None:
        warnings.warn(
            "episodes_per_task=1: a group of one has no baseline, so GRPO gives every "
            "episode advantage 0 and never trains. Set episodes_per_task to 2 or more (the "
            "cookbook uses 8), or train with distillation=... .",
            stacklevel=5,
        )
    if not isinstance(config.batch_size, int) or config.batch_size < 1:
        refuse("batch_size", config.batch_size, "an int >= 1 (tasks per step)")
    if not isinstance(config.num_steps, int) or config.num_steps < 1:
        refuse("num_steps", config.num_steps, "an int >= 1")
    if config.val_max_turns is not None and config.val_max_turns < 1:
        refuse("val_max_turns", config.val_max_turns, "None or an int >= 1")
    if config.validation_interval is not None and config.validation_interval < 1:
        refuse("validation_interval", config.validation_interval, "None or an int >= 1")
    if config.max_sampling_attempts < 1:
        refuse("max_sampling_attempts", config.max_sampling_attempts, "an int >= 1")
    if config.credit_assignment not in ADVANTAGE_ESTIMATORS:
        refuse(
            "credit_assignment",
            config.credit_assignment,
            f"one of the advantage estimators {sorted(ADVANTAGE_ESTIMATORS)}",
        )
    if config.max_model_length < 16:
        refuse("max_model_length", config.max_model_length, "an int >= 16")
    if not 1 <= config.max_tokens_per_turn < config.max_model_length:
        refuse(
            "max_tokens_per_turn",
            config.max_tokens_per_turn,
            f"an int in [1, max_model_length={config.max_model_length})",
        )
    if (
        config.overlong_buffer is not None
        and not 0 < config.overlong_buffer <= config.max_model_length
    ):
        refuse("overlong_buffer", config.overlong_buffer, "None or an int in (0, max_model_length]")
    if config.action_format != "auto" and config.action_format not in ACTION_FORMATS:
        refuse("action_format", config.action_format, f"'auto' or one of {sorted(ACTION_FORMATS)}")
    samples = config.max_samples_per_episode
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        refuse("max_samples_per_episode", samples, "None (all samples) or an int >= 1")
    if config.shared_prefix_min_length < 1:
        refuse("shared_prefix_min_length", config.shared_prefix_min_length, "an int >= 1")
    rows = config.token_tree_row_tokens
    if rows is not None and (not isinstance(rows, int) or rows < 1):
        refuse("token_tree_row_tokens", rows, "None (the longest row's) or an int >= 1")


def check_rewards(config: Any, refuse: Any) -> None:
    """``judge`` (:class:`~llm_gym.judge.JudgeSettings`' keys) and ``difficulty_sampling``
    (:class:`~trainers.grpo.difficulty.DifficultySettings`' keys; lockstep only), checked; no
    request is sent here."""
    from llm_gym.judge import JudgeSettings
    from trainers.grpo.difficulty import DifficultySettings

    if config.judge is not None:
        JudgeSettings.of(config.judge)
    if config.difficulty_sampling is not None:
        DifficultySettings.of(config.difficulty_sampling)
        if config.max_steps_off_policy is not None:
            refuse(
                "difficulty_sampling",
                config.difficulty_sampling,
                "None with async collection (max_steps_off_policy set): the rollout worker "
                "draws its own tasks",
            )


def check_config(config: Any) -> None:
    """Every check of this module on ``config``, then the field types (normalizes
    ``distillation`` to a plain dict)."""
    from llm_gym.errors import InvalidArgumentError
    from trainers.grpo.config.field_types import check_field_types

    def refuse(name: str, value: Any, allowed: str) -> None:
        raise InvalidArgumentError(f"{name} must be {allowed}, actual value: {value!r}.")

    if config.max_turns is not None and (
        not isinstance(config.max_turns, int) or config.max_turns < 1
    ):
        refuse("max_turns", config.max_turns, "an int >= 1 (or None, then set it before training)")
    if not isinstance(config.episodes_per_task, int) or config.episodes_per_task < 1:
        refuse("episodes_per_task", config.episodes_per_task, "an int >= 1 (the group size)")
    config.distillation = check_distillation(config.distillation, refuse)
    checks = (check_counts, check_backend, check_async, check_deadline, check_sampling)
    for check in (*checks, check_templates, check_rewards, check_outputs, check_health,
                  check_agent_fields, check_keep_best, check_dtype):  # fmt: skip
        check(config, refuse)
    check_field_types(config)  # last: the checks above say more about their own fields
