"""``docs/config.md``: the reference of :class:`~trainers.MultiTurnGRPOConfig`'s own fields.

Rendered from the dataclass (name, type, default, help), so it cannot drift from the code;
``tests/test_config_reference.py`` fails when the committed file is stale. Rewrite it with::

    python -m trainers.config_reference
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

from trl import GRPOConfig as _TRLGRPOConfig

from trainers.config import MultiTurnGRPOConfig
from trainers.distillation import DistillationConfig

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

PATH = Path(__file__).resolve().parents[1] / "docs" / "config.md"


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
    ``GRPOConfig`` or changes, then :class:`DistillationConfig`'s keys."""
    trl_defaults = {f.name: f for f in dataclasses.fields(_TRLGRPOConfig)}
    lines = [
        "# `MultiTurnGRPOConfig` reference",
        "",
        "`trainers.GRPOConfig` (= `MultiTurnGRPOConfig`) is TRL's `GRPOConfig` plus the fields",
        "below (new, or with a different default or meaning here); every other TRL field works as",
        "TRL documents it. In `train.py` configs they go in the `grpo:` section. Generated from",
        "the code by `python -m trainers.config_reference`.",
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
    return "\n".join(lines) + "\n"


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (``name: type = x`` then a string)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in itertools.pairwise(body):
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
