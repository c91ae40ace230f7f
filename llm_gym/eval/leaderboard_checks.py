"""The checks a leaderboard record read from ``leaderboard.json`` passes: every field of its
declared type, and every number in the range a run can make.

A file is input like any other: a hand edit, another tool or a merge can leave ``NaN`` as a
success rate, a rate of 7 or a negative count. The table would rank and print those as results,
so :func:`check_record_fields` refuses them, naming the field and its range.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "COUNT_FIELDS",
    "NON_NEGATIVE_FIELDS",
    "UNIT_FIELDS",
    "check_ranges",
    "check_record_fields",
    "field_hints",
]

UNIT_FIELDS = ("success_rate", "pass_at_k", "tool_error_rate", "parse_failure_rate")
"""Record fields that are fractions, in [0, 1]."""
COUNT_FIELDS = {"k": 1, "episodes": 1, "max_turns": 1, "tasks": 0}
"""Record fields that are counts, with the least value each takes."""
NON_NEGATIVE_FIELDS = ("turns_mean", "tokens_per_episode", "wall_time_s")
"""Record fields that are finite numbers >= 0 (``reward_mean`` is finite, of any sign)."""


def check_record_fields(cls: type, data: Mapping[str, Any]) -> None:
    """Refuse ``data`` unless it holds every field of the dataclass ``cls``, each of its declared
    type (``float`` takes an int, ``bool`` is no number; ``success_ci`` is ``[low, high]``), with
    the numbers :func:`check_ranges` reads in range.

    Raises:
        InvalidArgumentError: a field is missing, of another type, or out of its range.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [name for name in names if name not in data]
    if missing:
        raise InvalidArgumentError(f"A leaderboard record lacks the fields {missing}.")
    hints = field_hints(cls)
    for name in names:
        value = data[name]
        if not _matches(value, hints[name]) or (name == "success_ci" and len(value) != 2):
            shown = "[low, high]" if name == "success_ci" else _type_name(hints[name])
            raise InvalidArgumentError(
                f"The leaderboard record's {name!r} must be {shown}, actual value: {value!r:.80}."
            )
    check_ranges(data)


@functools.cache
def field_hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls``, resolved once (a file of 10,000 records reads them once)."""
    return typing.get_type_hints(cls)


def check_ranges(data: Mapping[str, Any]) -> None:
    """Refuse a record (its fields already of their types) whose numbers no run makes: NaN or
    an infinity, a rate outside [0, 1], an interval with ``low > high``, a count below its least
    value (:data:`COUNT_FIELDS`), a negative mean or time.

    Raises:
        InvalidArgumentError: every number out of range, named with its range.
    """
    ci = data["success_ci"]
    problems = [
        f"{name!r} must be in [0, 1]"
        for name in UNIT_FIELDS
        if not (math.isfinite(data[name]) and 0 <= data[name] <= 1)
    ]
    if not all(math.isfinite(v) and 0 <= v <= 1 for v in ci) or ci[0] > ci[1]:
        problems.append("'success_ci' must be [low, high] with 0 <= low <= high <= 1")
    problems += [
        f"{name!r} must be an integer >= {least}"
        for name, least in COUNT_FIELDS.items()
        if data[name] < least
    ]
    problems += [
        f"{name!r} must be a finite number >= 0"
        for name in NON_NEGATIVE_FIELDS
        if not (math.isfinite(data[name]) and data[name] >= 0)
    ]
    if not math.isfinite(data["reward_mean"]):
        problems.append("'reward_mean' must be a finite number")
    if problems:
        names = (*UNIT_FIELDS, "success_ci", "reward_mean", *COUNT_FIELDS, *NON_NEGATIVE_FIELDS)
        shown = {name: data[name] for name in names}
        raise InvalidArgumentError(
            f"The leaderboard record's {'; '.join(problems)}; actual values: {shown!r:.300}."
        )


def _matches(value: Any, hint: Any) -> bool:
    """Whether the JSON value ``value`` is of the field type ``hint`` (``str | None``,
    ``dict[str, float]``, ``list[float]``...; ``float`` takes an int, ``bool`` is no number)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        kinds = (int, float) if hint is float else int
        return isinstance(value, kinds) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    return isinstance(value, hint)


_TYPE_NAMES = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    type(None): ("null", "nulls"),
    Any: ("a value", "values"),
}


def _type_name(hint: Any, plural: bool = False) -> str:
    if hint in _TYPE_NAMES:
        return _TYPE_NAMES[hint][plural]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg, plural) for arg in typing.get_args(hint))
    kind = "an object" if typing.get_origin(hint) is dict else "a list"
    return f"{kind} of {_type_name(typing.get_args(hint)[-1], True)}"
