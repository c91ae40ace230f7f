"""One check for every config dataclass: each field holds a value of its annotated type.

A config is read from YAML or written by hand, and a dataclass takes any value for any field,
so a ``learning_rate: "x"``, a ``beta: "0.1"`` or a ``max_turns: true`` would otherwise reach
training after the model is built. :func:`check_field_types` refuses such a value when the config
is built, with the field, the value and the type the field takes.

Only what an annotation states plainly is checked: a field annotated with ``bool``, ``int``,
``float``, ``str``, a ``Literal``, or a union of these and ``None``. A field whose annotation
names anything else (a container, an enum, a class: libraries take more there than they
annotate, an ``AcceleratorConfig`` for a ``dict``) is left to its own checks. ``bool`` is not an
``int`` here, an ``int`` is a ``float``, NaN is no float a setting can mean, and a path
(``os.PathLike``) is a string.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import types
import typing
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = ["check_field_types"]

_PLAIN = (bool, int, float, str)
_NAMES = {bool: "a boolean", int: "an integer", float: "a number (not NaN)", str: "a string",
          type(None): "null"}  # fmt: skip


def _accepts(annotation: Any) -> tuple[Any, ...] | None:
    """The plain types and literal values ``annotation`` allows, or None when it names
    something else (then the field is not checked here)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return tuple(("literal", value) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        allowed: list[Any] = []
        for member in typing.get_args(annotation):
            accepted = _accepts(member)
            if accepted is None:
                return None
            allowed.extend(accepted)
        return tuple(allowed)
    if annotation is type(None) or annotation in _PLAIN:
        return (annotation,)
    return None


@functools.cache
def _field_rules(cls: type) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: nothing is checked
        return ()
    names = getattr(cls, "__dataclass_fields__", {})
    rules = ((name, _accepts(hints[name])) for name in names if name in hints)
    return tuple((name, allowed) for name, allowed in rules if allowed)


def _fits(value: Any, allowed: tuple[Any, ...]) -> bool:
    for rule in allowed:
        if isinstance(rule, tuple):  # ("literal", value)
            if type(value) is type(rule[1]) and value == rule[1]:
                return True
        elif rule is bool:
            if isinstance(value, bool):
                return True
        elif rule is int:
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return True
        elif rule is float:
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if real and not math.isnan(value):
                return True
        elif rule is str:
            if isinstance(value, str | os.PathLike):
                return True
        elif value is None:  # rule is type(None)
            return True
    return False


def _describe(allowed: tuple[Any, ...]) -> str:
    names = [repr(rule[1]) if isinstance(rule, tuple) else _NAMES[rule] for rule in allowed]
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_field_types(instance: Any, where: str = "") -> None:
    """Refuse a field of the dataclass ``instance`` whose value is not of its annotated type
    (see the module docstring); ``where`` prefixes the field's name (``"sft."``).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Settings:
        ...     steps: int = 1
        >>> check_field_types(Settings(steps=True))
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: steps must be an integer, actual value: True.

    Raises:
        InvalidArgumentError: naming the field, the type it takes and the value.
    """
    for name, allowed in _field_rules(type(instance)):
        value = getattr(instance, name)
        if not _fits(value, allowed):
            raise InvalidArgumentError(
                f"{where}{name} must be {_describe(allowed)}, actual value: {value!r:.80}."
            )
