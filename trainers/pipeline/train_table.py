"""Document 002's ``[train]`` table and TOML config files for ``train.py``.

Document 002 configures a multi-turn run in a ``[train]`` table of a TOML file
(``max_completion_tokens``, ``max_context_tokens``, ``group_size``, ``credit_assignment``).
``train.py`` reads such a file (:func:`toml_load`) and such a table, in TOML or YAML configs alike:
:func:`merge_train_table` writes each ``[train]`` setting into the ``grpo`` table under
:class:`~trainers.MultiTurnGRPOConfig`'s name for it (:data:`TRAIN_KEYS`). A key document 002 does
not name there is refused, and so is one setting given under both names with different values.

Example:
    >>> data = toml_load('[train]\\ngroup_size = 8\\n[grpo]\\nnum_steps = 2')
    >>> merge_train_table(data, "flash.toml")
    >>> data
    {'grpo': {'num_steps': 2, 'episodes_per_task': 8}}
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = ["MAX_TOML_DEPTH", "TRAIN_KEYS", "TrainKey", "merge_train_table", "toml_load"]


MAX_TOML_DEPTH = 100
"""The deepest nesting of tables and arrays a TOML config may hold (a config is 3 deep; the
document's own table is the first level). Python's TOML parser nests arrays and inline tables by
recursion: a document nested 5,000 deep raises RecursionError there."""


@dataclass(frozen=True)
class TrainKey:
    """One key of document 002's ``[train]`` table and the ``grpo`` field it sets."""

    name: str
    """Document 002's name, in ``[train]``."""
    field: str
    """The :class:`~trainers.MultiTurnGRPOConfig` field it sets (in the ``grpo`` table)."""
    meaning: str
    """What document 002 says the setting is."""


TRAIN_KEYS: tuple[TrainKey, ...] = (
    TrainKey("max_completion_tokens", "max_tokens_per_turn",
             "Tokens of one assistant action (one tool call or one reply), not of the episode."),
    TrainKey("max_context_tokens", "max_model_length",
             "Tokens of the whole running transcript: system prompt, every turn, every tool "
             "result."),
    TrainKey("group_size", "episodes_per_task",
             "Full episodes rolled out per prompt for the group-relative advantage."),
    TrainKey("credit_assignment", "credit_assignment",
             "per_episode (every assistant turn shares the episode's advantage) or per_turn "
             "(each turn its own, from per_turn_rewards)."),
)  # fmt: skip
"""The ``[train]`` keys document 002 names, each mapped onto the ``grpo`` field it means."""


def merge_train_table(data: dict[str, Any], where: str) -> None:
    """Move ``data``'s ``train`` table (document 002's ``[train]``) into its ``grpo`` table,
    each key under its :data:`TRAIN_KEYS` field name; ``where`` names the config in errors.

    A ``grpo`` key that gives the same setting the same value is kept as it is.

    Raises:
        InvalidArgumentError: ``train`` (or ``grpo``) is not a table, ``train`` holds a key
            document 002 does not name there (the known keys listed, the closest suggested), or
            ``train`` and ``grpo`` give one setting different values (both spellings named).
    """
    if "train" not in data:
        return
    train = data.pop("train")
    grpo = data.setdefault("grpo", {})
    for name, value in (("train", train), ("grpo", grpo)):
        if not isinstance(value, dict):
            raise InvalidArgumentError(
                f"{where}: {name} must be a table of keys to values, actual value: {value!r:.80}."
            )
    fields = {key.name: key.field for key in TRAIN_KEYS}
    unknown = [key for key in train if key not in fields]
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key {unknown[0]!r} in [train]; document 002's [train] keys are "
            f"{sorted(fields)}.{did_you_mean(unknown[0], fields)} Any other GRPO setting goes in "
            "[grpo] under MultiTurnGRPOConfig's name (docs/config.md)."
        )
    for name, value in train.items():
        field = fields[name]
        if field in grpo and not (type(grpo[field]) is type(value) and grpo[field] == value):
            raise InvalidArgumentError(
                f"{where}: train.{name} = {value!r:.40} and grpo.{field} = {grpo[field]!r:.40} "
                "set one setting to different values; keep one of the two."
            )
        grpo[field] = value


def toml_load(text: str) -> dict[str, Any]:
    """``tomllib.loads``, nested at most :data:`MAX_TOML_DEPTH` deep.

    Raises:
        InvalidArgumentError: not TOML (the parser's reason and place, on one line), or nested
            deeper than :data:`MAX_TOML_DEPTH`.

    Example:
        >>> toml_load('env = "Refund-v0"\\n[grpo]\\nlearning_rate = 1e-4')
        {'env': 'Refund-v0', 'grpo': {'learning_rate': 0.0001}}
    """
    too_deep = InvalidArgumentError(
        f"the TOML document nests more than {MAX_TOML_DEPTH} levels deep (the limit "
        "trainers.pipeline.train_table.MAX_TOML_DEPTH)."
    )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"not valid TOML: {' '.join(str(exc).split())}.") from None
    except RecursionError:  # arrays and inline tables hundreds deep: past any depth allowed
        raise too_deep from None
    if _depth(data) > MAX_TOML_DEPTH:  # [a.b.c...] headers and dotted keys nest without recursion
        raise too_deep
    return data


def _depth(data: Any) -> int:
    """The nesting depth of tables and arrays in ``data`` (a table alone is 1), without
    recursion."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return deepest
