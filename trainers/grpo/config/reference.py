"""``docs/config.md``: the reference of :class:`~trainers.MultiTurnGRPOConfig`'s own fields.

Rendered from the dataclass (name, type, default, help), so it cannot drift from the code;
``tests/test_config_reference.py`` fails when the committed file is stale. Rewrite it with::

    python -m trainers.grpo.config.reference
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

from trl import GRPOConfig as _TRLGRPOConfig

from llm_gym.errors import InvalidArgumentError
from trainers.distillation.config import DistillationConfig
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig

__all__ = ["render", "PATH"]

TRL_FIELDS_READ = (
    "learning_rate",
    "temperature",
    "top_p",
    "beta",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "reward_weights",
    "chat_template_kwargs",
    "log_completions",
    "use_vllm",
    "vllm_mode",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_clip_max",
)
"""TRL fields with TRL's meaning that the multi-turn trainer reads (listed for reference)."""

PATH = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{field.default_factory()!r}`"
    return "required"


def _type(field: dataclasses.Field) -> str:
    kind = field.type.__name__ if isinstance(field.type, type) else str(field.type)
    return kind.replace("typing.", "").replace("|", "\\|")


def render() -> str:
    """The reference as markdown: the fields :class:`MultiTurnGRPOConfig` adds to TRL's
    ``GRPOConfig`` or changes, :class:`DistillationConfig`'s keys, the ``sft:`` table's keys,
    document 002's ``[train]`` keys, an ``envs:`` entry's keys, then how ``"module:attr"``
    references resolve."""
    trl_defaults = {f.name: f for f in dataclasses.fields(_TRLGRPOConfig)}
    lines = [
        "# `MultiTurnGRPOConfig` reference",
        "",
        "`trainers.GRPOConfig` (= `MultiTurnGRPOConfig`) is TRL's `GRPOConfig` plus the fields",
        "below (new, or with a different default or meaning here); every other TRL field works as",
        "TRL documents it. In `train.py` configs they go in the `grpo:` section. Generated from",
        "the code by `python -m trainers.grpo.config.reference`.",
        "",
        "| field | type | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    for field in dataclasses.fields(MultiTurnGRPOConfig):
        theirs = trl_defaults.get(field.name)
        if theirs is not None and theirs.metadata == field.metadata:
            continue
        help_text = " ".join(str(field.metadata.get("help", "")).split()).replace("|", "\\|")
        lines.append(f"| `{field.name}` | {_type(field)} | {_default(field)} | {help_text} |")
    lines += [
        "",
        "## TRL's fields the multi-turn trainer reads",
        "",
        "With TRL's meaning; `temperature` and `top_p` also drive the rollouts, and",
        "`chat_template_kwargs` reaches the rollouts, validation and the token samples.",
        "",
        "| field | type | default | what it does (TRL's help) |",
        "| --- | --- | --- | --- |",
    ]
    for name in TRL_FIELDS_READ:
        field = trl_defaults[name]
        help_text = " ".join(str(field.metadata.get("help", "")).split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(field)} | {_default(field)} | {help_text} |")
    lines += [
        "",
        "## `distillation`",
        "",
        "A mapping with these keys (`trainers.DistillationConfig`; a `distillation:` section in",
        "`train.py` configs):",
        "",
        "| key | type | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    docs = _attribute_docs(DistillationConfig)
    for field in dataclasses.fields(DistillationConfig):
        lines.append(
            f"| `{field.name}` | {_type(field)} | {_default(field)} | {docs.get(field.name, '')} |"
        )
    sections = [
        *_sft_section(),
        *_train_table_section(),
        *_mixture_section(),
        *_references_section(),
    ]
    return "\n".join([*lines, *sections]) + "\n"


def _sft_section() -> list[str]:
    """The keys of the ``sft:`` table (:class:`trainers.sft.settings.SFTSettings`)."""
    from trainers.sft.settings import SFTSettings

    lines = [
        "",
        "## `sft`: the warm start",
        "",
        "A `train.py` config may warm-start the model by SFT before GRPO (an `sft:` section).",
        "Its keys are the fields of `trainers.sft.settings.SFTSettings`, the one record that",
        "`trainers.sft.train.sft_warm_start` takes from Python and `llm-gym sft` builds from its",
        "flags; each is checked when the config is read.",
        "",
        "| key | type | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    docs = _attribute_docs(SFTSettings)
    for field in dataclasses.fields(SFTSettings):
        lines.append(
            f"| `{field.name}` | {_type(field)} | {_default(field)} | {docs.get(field.name, '')} |"
        )
    return lines


def _mixture_section() -> list[str]:
    """The keys of an ``envs:`` entry (:class:`trainers.mixture.config.MixtureEntry`)."""
    from trainers.mixture.config import MixtureEntry

    lines = [
        "",
        "## `envs`: a mixture of environments",
        "",
        "A `train.py` config may name several environments with weights instead of `env`",
        "(`envs: [{id: ToolUseGame-v0, weight: 2}, {id: GuessNumber-v0}]`; `train_multi_turn`",
        "takes `envs=[MixtureEnv(...)]`). Each step's groups are drawn by weight, stratified",
        "(`trainers.mixture.env.stratified_slots`); an `sft` warm start splits its `episodes`",
        "among them by the same rule, each environment's oracle on its entry's `task_options`",
        "(`trainers.mixture.sft`); see `docs/guides/mixtures.md`. An entry's keys:",
        "",
        "| key | type | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    docs = _attribute_docs(MixtureEntry)
    for field in dataclasses.fields(MixtureEntry):
        lines.append(
            f"| `{field.name}` | {_type(field)} | {_default(field)} | {docs.get(field.name, '')} |"
        )
    return lines


def _train_table_section() -> list[str]:
    """Document 002's ``[train]`` keys and the fields they set
    (:data:`trainers.pipeline.train_table.TRAIN_KEYS`)."""
    from trainers.pipeline.train_table import TRAIN_KEYS

    lines = [
        "",
        "## Document 002's `[train]` table",
        "",
        "A `train.py` config (TOML, `.toml`, or YAML) may give these settings in a `[train]` table",
        "(`train:` in YAML) under document 002's names; each sets the field beside it. Another",
        "key there is refused by name, and so is one setting given under both names with",
        "different values. `--set train.group_size=8` overrides one.",
        "",
        "| `[train]` key | sets | what it is (document 002) |",
        "| --- | --- | --- |",
    ]
    for key in TRAIN_KEYS:
        lines.append(f"| `{key.name}` | `grpo.{key.field}` | {key.meaning} |")
    return lines


def _references_section() -> list[str]:
    """How ``"module:attr"`` references in a config resolve (:mod:`llm_gym.core.references`)."""
    from llm_gym.core.references import PROJECT_MODULES, REFUSED_MODULES, TRUSTED_MODULES_ENV

    project = " or ".join(f"`{name}`" for name in PROJECT_MODULES)
    refused = ", ".join(f"`{name}`" for name in sorted(REFUSED_MODULES))
    return [
        "",
        '## `"module:attr"` references',
        "",
        'A config names code by `"module:attr"` strings: `sft.oracle` and',
        "`sft.short_context_oracle` in `train.py` configs, and an environment, its tasks or its",
        "oracle given as a string to `gym.make`, `run_and_report`, `llm-gym eval` or the trainer.",
        f"Such a reference resolves only when its module is in {project}, when Python code",
        "registered that exact reference (`register_env`, `register_policy`,",
        "`register_multi_turn_env`, `register_single_turn_env`), or when its module is under a",
        "prefix you trust:",
        "",
        "- `train.py --config CONFIG --trust-module my_pkg` (repeatable; the processes it starts",
        "  inherit it),",
        f"- `{TRUSTED_MODULES_ENV}=my_pkg,other` in the environment,",
        '- `llm_gym.core.factories.trust_modules("my_pkg")` from Python.',
        "",
        "A prefix covers the module of that name and its submodules (`my_pkg` covers",
        "`my_pkg.envs`, not `my_pkg_extra`); `*` covers every module. Never trusted, under any",
        f"prefix: {refused}, their submodules and their `_`-prefixed twins (`_pickle`).",
        "The path after the colon may not take a dunder name (`__globals__`), step into a module",
        "that is not trusted (`llm_gym.some_module:os.system`) or reach a class or function",
        "defined in a refused module. A refused reference is an `InvalidArgumentError` that",
        "names it and the remedy; Python code that passes objects instead of strings is not",
        "affected.",
    ]


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (``name: type = x`` then a string)."""
    import ast
    import inspect

    (statement,) = ast.parse(inspect.getsource(cls)).body  # a class's source: its statement
    if not isinstance(statement, ast.ClassDef):
        raise InvalidArgumentError(f"Expected a dataclass, actual value: {cls!r}.")
    docs = {}
    for node, following in itertools.pairwise(statement.body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split()).replace("|", "\\|")
    return docs


if __name__ == "__main__":
    PATH.write_text(render())
    sys.stdout.write(f"wrote {PATH}\n")
