"""The SFT warm start's one record of settings (:class:`SFTSettings`, ``sft:`` in a ``train.py``
config, or built by ``llm-gym sft`` from its flags), the settings of its two phases, and the
fields of TRL's ``SFTConfig`` that a phase's settings give."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

from llm_gym.errors import InvalidArgumentError
from trainers.grpo.config.field_types import check_field_types

__all__ = [
    "LossMask",
    "SFTSettings",
    "check_trl_options",
    "full_phase",
    "sft_config_fields",
    "short_context_phase",
    "short_share",
]

LossMask = Literal["rl", "trl"]
"""``"rl"``: train exactly the tokens RL trains; ``"trl"``: TRL's training template."""


@dataclass(frozen=True)
class SFTSettings:
    """Multi-turn SFT warm start on the environment's oracle transcripts, on a document-002
    environment's ``sft_completion`` targets, or on saved episodes filtered by reward
    (rejection-sampling fine-tuning).

    One record for the whole warm start. ``source``, ``from_episodes``, ``min_reward``,
    ``episodes``, the demonstrators (``oracle``, ``short_context_oracle`` and their options),
    ``task_options`` and ``only_successful`` say where the transcripts come from (the
    ``train.py`` pipeline reads them, :mod:`trainers.pipeline.sft`); the other fields say how
    :func:`trainers.sft.train.sft_warm_start` trains on them. Every field is checked when the
    record is built (its type, then its range), so a bad value fails before any model loads;
    the record is frozen (``dataclasses.replace`` makes a checked copy).

    Example:
        >>> SFTSettings(max_steps=100, batch_size=8).lr_scheduler_type
        'cosine'
        >>> SFTSettings(batch_size=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: sft.batch_size must be an integer >= 1, ...
    """

    source: Literal["oracle", "sft_completion", "episodes"] = "oracle"
    """Where the transcripts come from: ``oracle`` (the demonstrator's episodes, run in the
    environment), ``sft_completion`` (document 002's rows, ``env.start_episode(example,
    prompt_text) + env.sft_completion(example)``, for an ``EnvironmentMultiTurn`` environment)
    or ``episodes`` (the saved episodes of ``from_episodes`` with ``reward >= min_reward``);
    the last two take no demonstrator settings."""
    from_episodes: str | None = None
    """With ``source: episodes``: an episodes JSONL file or a folder of them (``llm-gym eval
    --save-episodes``, the trainer's ``save_episodes``; :mod:`llm_gym.eval.episode_files`)."""
    min_reward: float | None = None
    """With ``source: episodes``: keep the episodes whose reward reaches this (None: all)."""
    episodes: int = 4000
    """Transcripts to train on (train split tasks, then fresh seeded tasks if needed)."""
    learning_rate: float = 5e-4
    """AdamW peak learning rate (both phases). The embedded tiny model learns tool names and keys
    at 2e-3 but never learns to copy a number from a tool result (the loss stalls near 0.2); at
    5e-4 copying appears within a few hundred steps (``tests/test_sft_copying.py``)."""
    batch_size: int = 32
    """Transcripts per optimizer step."""
    epochs: float = 1.0
    """Passes over the transcripts (of the full-transcript phase, when max_steps is None)."""
    max_steps: int | None = None
    """Steps of the full-transcript phase (None: by epochs)."""
    short_context_steps: int = 0
    """Steps of a first phase on the transcripts without system prompt and tool specs
    (:func:`trainers.sft.data.short_context_dataset`): a small model learns to copy names and
    numbers there much sooner; 0: no such phase."""
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine"
    """The decay of the full-transcript phase: cosine, linear or constant (the short-context
    phase runs at a constant rate after its warmup)."""
    warmup_steps: int = 10
    """Linear warmup steps at the start of the first phase."""
    oracle: str | None = None
    """The demonstrator, as ``"module:attr"`` (``(task, messages) -> Message``); None: the
    environment's registered oracle. An imperfect one (ToolUseGame's ``hasty_oracle_action``)
    gives a warm start that RL then corrects. The module must be in llm_gym or trainers, or
    trusted (``train.py --trust-module my_pkg``; see :mod:`llm_gym.core.references`)."""
    oracle_options: dict[str, Any] | None = None
    """With options, ``oracle`` names a factory and the demonstrator is ``oracle(**options)``
    (``{guess_rate: 0.5}`` for ToolUseGame's ``HastyOracle``)."""
    short_context_oracle: str | None = None
    """The demonstrator of the short-context phase (the same form as ``oracle``); None: the
    environment's registered oracle. The skills (copying names and numbers) come from clean
    demonstrations there; the full phase's ``oracle`` sets the habits."""
    short_context_oracle_options: dict[str, Any] | None = None
    """Options of ``short_context_oracle`` (as ``oracle_options``)."""
    task_options: dict[str, Any] | None = None
    """Options of the SFT tasks' generator on top of the job's ``task_options`` (ToolUseGame:
    ``{worlds_per_question: 8}``, each question asked in 8 worlds, so its answer must be read
    from the tool results, not recalled); None: the job's alone."""
    only_successful: bool = True
    """Keep only the demonstrations that succeed (False: keep the failed ones too, as an
    imperfect demonstrator's data would); ``sft_completion`` targets are not scored."""
    time_budget_s: float | None = None
    """Stop after this many seconds of training, both phases together (None: no limit); the
    short-context phase gets at most its share of the steps (half when the full phase runs by
    epochs)."""
    lora: dict[str, Any] | None = None
    """Train a LoRA adapter (``peft.LoraConfig`` arguments, ``{r: 16, lora_alpha: 32}``;
    ``target_modules`` defaults to ``"all-linear"``), merged into the saved model; None: every
    weight."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (each of ``batch_size`` transcripts)."""
    min_lr_ratio: float = 0.0
    """The floor of the cosine or linear decay, as a share of ``learning_rate`` (0 to 1). With a
    time budget the decay follows the larger of the step fraction and the spent share of the
    budget, so a run the budget stops ends at the bottom of its schedule."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (>= 0; 0: no clipping)."""
    max_length: int | None = 2048
    """Transcripts are truncated to this many tokens (keep it above the longest); None: never."""
    logging_steps: int = 10
    """Log (loss, learning rate, tokens) every this many steps."""
    loss_mask: LossMask = "rl"
    """``rl``: train exactly the tokens RL trains (assistant content and its end-of-turn token):
    for TRL's Qwen2.5 template through :mod:`trainers.chat_template`, for any other the rows as
    the rollout tokenizes them (:func:`trainers.sft.data.rl_token_rows`); ``trl``: TRL's
    training template (also the newline before and after each assistant turn)."""
    use_cpu: bool | None = None
    """Train on the CPU; None: when CUDA is not available."""
    bf16: bool = False
    """bf16 autocast (the weights stay fp32 and are saved fp32); on a CPU with AMX it speeds up
    steps without ``shared_prefix``, not those with it."""
    shared_prefix: bool = True
    """Run the token prefix that every transcript of a batch shares (the system prompt with the
    tool specs) once per batch and reuse its keys and values for every row
    (:func:`trainers.grpo.shared_prefix.shared_prefix_inputs`): the same loss and gradients (to
    float rounding), several times faster at large batches. Applies when that prefix holds no
    trained token and is at least 32 tokens long; otherwise the batch runs as usual."""
    length_chunked: bool = True
    """Run a batch as chunks of rows of similar length, each only as wide as its longest row and
    with its own shared prefix (:class:`trainers.grpo.length_chunks.LengthChunkedLM`): the same
    loss and gradients, without the padding's FLOPs; the LM head then scores only the labelled
    positions (:mod:`trainers.sft.labelled_head`, where the model allows it)."""
    progress: bool = True
    """Show transformers' progress bar."""
    trl_options: dict[str, Any] | None = None
    """More fields of TRL's ``SFTConfig``, given to it as they are
    (``{label_smoothing_factor: 0.1}``); a field the warm start sets itself is refused."""

    def __post_init__(self) -> None:
        check_field_types(self, "sft.")
        for name, least in (("episodes", 1), ("batch_size", 1), ("max_steps", 1),
                            ("short_context_steps", 0), ("warmup_steps", 0),
                            ("gradient_accumulation_steps", 1), ("max_length", 1),
                            ("logging_steps", 1)):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < least:
                raise InvalidArgumentError(
                    f"sft.{name} must be an integer >= {least}, actual value: {value!r}."
                )
        episodes = self.source == "episodes"
        if episodes != (self.from_episodes is not None) or (
            self.min_reward is not None and not episodes
        ):
            raise InvalidArgumentError(
                "sft.from_episodes (the episodes file, required) and sft.min_reward go with "
                f"sft.source 'episodes'; actual: source={self.source!r}, from_episodes="
                f"{self.from_episodes!r:.80}, min_reward={self.min_reward!r}."
            )
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise InvalidArgumentError(
                f"sft.min_reward must be a finite number or null, actual: {self.min_reward!r}."
            )
        for name in ("learning_rate", "epochs", "time_budget_s"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise InvalidArgumentError(
                    f"sft.{name} must be a finite number > 0, actual value: {value!r}."
                )
        for name, most in (("min_lr_ratio", 1.0), ("weight_decay", math.inf),
                           ("max_grad_norm", math.inf)):  # fmt: skip
            value = getattr(self, name)
            if not (0 <= value <= most and math.isfinite(value)):
                bound = "between 0 and 1" if most == 1.0 else ">= 0"
                raise InvalidArgumentError(
                    f"sft.{name} must be a finite number {bound}, actual value: {value!r}."
                )
        for name in ("oracle_options", "short_context_oracle_options", "task_options",
                     "lora", "trl_options"):  # fmt: skip
            if not isinstance(getattr(self, name), dict | None):
                raise InvalidArgumentError(
                    f"sft.{name} must be a mapping of keys to values or null, actual value: "
                    f"{getattr(self, name)!r:.80}."
                )


def short_share(sft: SFTSettings) -> float:
    """The share of the SFT time budget the short-context phase may use: its share of the steps
    (its steps are the cheaper ones, so the full phase keeps at least its share of the time), or
    half when the full phase runs by epochs.

    Example:
        >>> short_share(SFTSettings(short_context_steps=100, max_steps=300))
        0.25
        >>> short_share(SFTSettings(short_context_steps=100))
        0.5
    """
    if sft.max_steps is None:
        return 0.5
    return sft.short_context_steps / (sft.short_context_steps + sft.max_steps)


def short_context_phase(sft: SFTSettings) -> SFTSettings:
    """The settings of the short-context phase: ``short_context_steps`` steps at a constant rate
    after the warmup, within :func:`short_share` of the time budget; a phase of its own (no
    further short-context phase).

    Example:
        >>> phase = short_context_phase(
        ...     SFTSettings(short_context_steps=100, max_steps=300, time_budget_s=60)
        ... )
        >>> phase.max_steps, phase.lr_scheduler_type, phase.time_budget_s, phase.short_context_steps
        (100, 'constant', 15.0, 0)
    """
    budget = sft.time_budget_s
    return dataclasses.replace(
        sft,
        max_steps=sft.short_context_steps,
        short_context_steps=0,
        lr_scheduler_type="constant",
        time_budget_s=None if budget is None else budget * short_share(sft),
    )


def full_phase(sft: SFTSettings, short_seconds: float | None) -> SFTSettings:
    """The settings of the full-transcript phase, after a short-context phase that took
    ``short_seconds`` (None: none ran, and the settings are ``sft``'s own): no second warmup,
    and the rest of the time budget, at least a tenth of it.

    Example:
        >>> sft = SFTSettings(short_context_steps=100, max_steps=300, time_budget_s=60)
        >>> phase = full_phase(sft, short_seconds=20.0)
        >>> phase.max_steps, phase.warmup_steps, phase.time_budget_s, phase.short_context_steps
        (300, 0, 40.0, 0)
        >>> full_phase(sft, short_seconds=58.0).time_budget_s  # a tenth of the budget is left
        6.0
        >>> full_phase(SFTSettings(), short_seconds=None) == SFTSettings()
        True
    """
    if short_seconds is None:
        return sft
    budget = sft.time_budget_s
    return dataclasses.replace(
        sft,
        short_context_steps=0,
        warmup_steps=0,
        time_budget_s=None if budget is None else max(budget - short_seconds, 0.1 * budget),
    )


def sft_config_fields(
    settings: SFTSettings,
    output_dir: str | os.PathLike[str],
    seed: int,
    *,
    tokenized: bool,
    use_cpu: bool,
) -> dict[str, Any]:
    """The ``SFTConfig`` fields the warm start sets from ``settings`` (``tokenized``: the rows
    carry their own ``assistant_masks``; TRL's template masks the others). Checkpoints, evaluation
    and reporting are off, the weights stay fp32 (``bf16`` autocasts), and ``seed`` also orders
    the data.

    Example:
        >>> settings = SFTSettings(max_steps=5, batch_size=8)
        >>> fields = sft_config_fields(settings, "out", 0, tokenized=False, use_cpu=True)
        >>> fields["max_steps"], fields["per_device_train_batch_size"], fields["report_to"]
        (5, 8, 'none')
    """
    return dict(
        output_dir=str(output_dir),
        assistant_only_loss=not tokenized,
        learning_rate=settings.learning_rate,
        num_train_epochs=settings.epochs,
        max_steps=-1 if settings.max_steps is None else settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        lr_scheduler_type=settings.lr_scheduler_type,
        warmup_steps=settings.warmup_steps,
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.max_grad_norm,
        max_length=settings.max_length,
        logging_steps=settings.logging_steps,
        seed=seed,
        data_seed=seed,
        bf16=settings.bf16,
        fp16=False,
        use_cpu=use_cpu,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=not settings.progress,
        dataloader_num_workers=0,
    )


def check_trl_options(
    options: dict[str, Any] | None, fields: dict[str, Any], config_class: type
) -> dict[str, Any]:
    """``options`` (``settings.trl_options``) when each names a field of ``config_class``
    (TRL's ``SFTConfig``) that is not among ``fields`` (those the warm start sets), else an error
    naming the first that does not.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Config:
        ...     seed: int = 0
        ...     label_smoothing_factor: float = 0.0
        >>> check_trl_options({"label_smoothing_factor": 0.1}, {"seed": 0}, Config)
        {'label_smoothing_factor': 0.1}
        >>> check_trl_options({"seed": 1}, {"seed": 0}, Config)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: sft.trl_options names 'seed', and the warm start ...
    """
    options = dict(options or {})
    known = {field.name for field in dataclasses.fields(config_class)}
    for name in options:
        if name in fields or name not in known:
            why = "the warm start sets it" if name in fields else "SFTConfig has no such field"
            raise InvalidArgumentError(
                f"sft.trl_options names {name!r}, and {why}; name another SFTConfig field, "
                "or set it through the SFTSettings field of its meaning."
            )
    return options
