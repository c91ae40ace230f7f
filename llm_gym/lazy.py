"""Packages whose public names load their module on first use (PEP 562).

A package that must import light (no torch, no optional SDK) maps each public name to the module
that defines it and hands :func:`lazy_names`' two functions to the interpreter:

    __getattr__, __dir__ = lazy_names(__name__, {"load_tiny_model": "llm_gym.models.tiny"}, __all__)

The first access imports the module and stores the value in the package, so later accesses are
plain attribute reads; an unknown name is an ``AttributeError`` naming the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, modules: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``modules`` maps a name to its module's
    full dotted path, or to a submodule of ``package`` (a path without a dot)."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if "." in module else f"{package}.{module}"
        value = getattr(importlib.import_module(path), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
