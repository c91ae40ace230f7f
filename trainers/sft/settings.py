"""``sft:`` in a ``train.py`` config: the SFT warm start's settings (:class:`SFTSettings`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from llm_gym.errors import InvalidArgumentError
from trainers.grpo.config.field_types import check_field_types

__all__ = ["SFTSettings"]


@dataclass
class SFTSettings:
    """Multi-turn SFT warm start on the environment's oracle transcripts, on a document-002
    environment's ``sft_completion`` targets, or on saved episodes filtered by reward
    (rejection-sampling fine-tuning)."""

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
    """AdamW learning rate (both phases). The embedded tiny model never learns to copy a number
    from a tool result at 2e-3; at 5e-4 it does (see :func:`trainers.sft.train.sft_warm_start`)."""
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
    """Train a LoRA adapter (``peft.LoraConfig`` arguments, ``{r: 16, lora_alpha: 32}``),
    merged into the saved model; None: every weight."""

    def __post_init__(self) -> None:
        check_field_types(self, "sft.")
        for name, least in (("episodes", 1), ("batch_size", 1), ("max_steps", 1),
                            ("short_context_steps", 0), ("warmup_steps", 0)):  # fmt: skip
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
        for name in ("oracle_options", "short_context_oracle_options", "task_options"):
            if not isinstance(getattr(self, name), dict | None):
                raise InvalidArgumentError(
                    f"sft.{name} must be a mapping of keys to values or null, actual value: "
                    f"{getattr(self, name)!r:.80}."
                )
